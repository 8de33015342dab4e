"""Every public name and module path of HuggingFace Accelerate exists in accel.

The list comes from `tools/compat/list_accelerate_api.py` run against an installed
accelerate and is committed as `data/accelerate_public_api.json`, so this test needs no
accelerate: `accelerate.X.Y` must import as `accel.X.Y` and hold the same names.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

API = json.loads((Path(__file__).parent / "data" / "accelerate_public_api.json").read_text())
MODULES: dict[str, list[str]] = API["modules"]


def _accel_path(path: str) -> str:
    return "accel" + path[len("accelerate") :]


@pytest.mark.parametrize("path", sorted(MODULES))
def test_module_path_and_names_exist(path: str) -> None:
    module = importlib.import_module(_accel_path(path))
    missing = [name for name in MODULES[path] if not hasattr(module, name)]
    assert not missing, f"{_accel_path(path)} lacks {missing}"


def test_the_list_is_complete_enough_to_mean_something() -> None:
    assert len(MODULES) >= 50
    assert sum(map(len, MODULES.values())) >= 600


def test_left_out_features_fail_clearly_on_use() -> None:
    from accel.utils import GPTTrainStep

    with pytest.raises(NotImplementedError, match="Megatron-LM"):
        GPTTrainStep()


def test_availability_probes_tell_the_truth() -> None:
    import importlib.util

    from accel.utils import is_deepspeed_available, is_pytest_available, is_torch_xla_available

    assert is_pytest_available() is True
    assert is_deepspeed_available() is (importlib.util.find_spec("deepspeed") is not None)
    # installed, and not turned off by USE_TORCH_XLA=0 (as CI's torch-2.9 lane runs the suite)
    turned_off = os.environ.get("USE_TORCH_XLA", "1").lower() in ("0", "false", "no", "off")
    installed = importlib.util.find_spec("torch_xla") is not None
    assert is_torch_xla_available() is (installed and not turned_off)


def test_pure_utilities() -> None:
    from accel.utils import compare_versions, is_torch_version, patch_environment, str_to_bool

    assert str_to_bool("YES") == 1 and str_to_bool("off") == 0
    with pytest.raises(ValueError, match="maybe"):
        str_to_bool("maybe")
    os.environ.pop("ACCEL_TEST_PATCHED", None)
    with patch_environment(accel_test_patched=3):
        assert os.environ["ACCEL_TEST_PATCHED"] == "3"
    assert "ACCEL_TEST_PATCHED" not in os.environ
    assert is_torch_version(">=", "2.0")
    assert compare_versions("torch", "<", "999")


def test_offloaded_weight_round_trip(tmp_path: Path) -> None:
    import torch

    from accel.utils import load_offloaded_weight, offload_weight

    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    index = offload_weight(weight, "w", tmp_path)
    assert index == {"w": {"dtype": "float32", "shape": [2, 3]}}  # accelerate's entry
    back = load_offloaded_weight(tmp_path / "w.dat", index["w"])
    assert torch.equal(back, weight)


def test_new_paths_are_not_imported_by_import_accel() -> None:
    code = "import sys, accel; print(sorted(m for m in sys.modules if m.startswith('accel.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout
    for path in ("accel.utils", "accel.commands", "accel.accelerator", "accel.inference"):
        assert f"'{path}'" not in loaded


def test_familiar_parallelism_config_is_accelerates_environment_reading_one() -> None:
    import accel
    import accel.parallelism_config
    import accel.utils
    import accel_parallel

    familiar = accel.parallelism_config.ParallelismConfig
    assert accel.utils.ParallelismConfig is familiar is accel.ParallelismConfig
    assert issubclass(familiar, accel_parallel.ParallelismConfig)
    assert familiar is not accel_parallel.ParallelismConfig  # the leaf's own reads no variable
