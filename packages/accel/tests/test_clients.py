"""Libraries built on accelerate, on accel through the opt-in switch (`accel.use_as_accelerate`,
`ACCEL_AS_ACCELERATE=1`; `accel launch --as_accelerate` is tested in integration-tests).

The switch is exercised in fresh interpreters, as a user meets it. A stand-in "real"
accelerate distribution (a package and its dist-info on PYTHONPATH) makes the "accelerate is
installed too" case the same on every machine. transformers' and PEFT's own flows run in one
subprocess (`_client_flows.py`) per launch; the tests here compare what it wrote.
"""

from __future__ import annotations

import importlib.util
import json
import os
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from accel._as_accelerate import ENV_AS_ACCELERATE, REPORTED_VERSION, is_used_as_accelerate
from accel_testkit import assert_same_training, float32_error

HERE = Path(__file__).parent
FLOWS = HERE / "_client_flows.py"
STARTUP_HOOK = HERE.parent / "startup" / "accel_as_accelerate.pth"
ACCEL_DIR = str(Path(importlib.util.find_spec("accel").origin).parent)
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
HAS_PEFT = importlib.util.find_spec("peft") is not None
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers not installed")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_AS_ACCELERATE}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)
    return env


def _python(code: str, timeout: int = 120, **env: str) -> dict[str, Any]:
    """Run `code` in a fresh interpreter; it prints one JSON line last."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(**env),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr}


@pytest.fixture(scope="module")
def real_accelerate(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder holding a stand-in for the real accelerate distribution, version 0.20.0."""
    root = tmp_path_factory.mktemp("real_accelerate")
    (root / "accelerate").mkdir()
    (root / "accelerate" / "__init__.py").write_text('__version__ = "0.20.0"\nREAL = True\n')
    info = root / "accelerate-0.20.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: accelerate\nVersion: 0.20.0\n")
    (info / "top_level.txt").write_text("accelerate\n")
    return str(root)


PROBE = """
import importlib.metadata as md, importlib.util, json, sys
from accel._as_accelerate import is_used_as_accelerate
on_at_start = is_used_as_accelerate()
torch_at_start = "torch" in sys.modules
{setup}
import accelerate
try:
    version = md.version("accelerate")
except md.PackageNotFoundError:
    version = None
print(json.dumps({{
    "on_at_start": on_at_start, "torch_at_start": torch_at_start, "on": is_used_as_accelerate(),
    "file": accelerate.__file__, "module_version": accelerate.__version__,
    "metadata_version": version, "real": getattr(accelerate, "REAL", False),
}}))
"""


def test_off_by_default_nothing_is_redirected(real_accelerate: str) -> None:
    import accel  # noqa: F401  (importing accel turns nothing on)

    assert not is_used_as_accelerate()
    out = _python(PROBE.format(setup="import accel"), PYTHONPATH=real_accelerate)
    assert not out["on"] and out["real"] and out["file"].startswith(real_accelerate)
    assert out["metadata_version"] == out["module_version"] == "0.20.0"


def test_switch_in_code_wins_over_an_installed_accelerate(real_accelerate: str) -> None:
    setup = """
import accel, accel.utils, accel.utils.modeling, accel.hooks
accel.use_as_accelerate(); accel.use_as_accelerate()  # twice: the second does nothing
import accelerate.utils, accelerate.utils.modeling, accelerate.hooks, accelerate.commands.launch
from accelerate import Accelerator, init_empty_weights
from accelerate.utils.modeling import get_max_layer_size
assert accelerate.utils is accel.utils and accelerate.hooks is accel.hooks
assert accelerate.utils.modeling is accel.utils.modeling
assert Accelerator is accel.Accelerator and init_empty_weights is accel.init_empty_weights
assert sys.modules["accelerate.commands.launch"] is sys.modules["accel.commands.launch"]
assert sorted(set(accel.__all__) - set(dir(sys.modules["accelerate"]))) == []
try:
    import accelerate.no_such_module
    raise AssertionError("imported a module that does not exist")
except ModuleNotFoundError as error:
    assert "accelerate.no_such_module" in str(error)
assert importlib.util.find_spec("accelerate").loader.__class__.__name__ == "_AliasLoader"
"""
    out = _python(PROBE.format(setup=setup), PYTHONPATH=real_accelerate)
    assert out["on"] and not out["real"]
    assert out["file"].startswith(ACCEL_DIR)
    assert out["module_version"] == out["metadata_version"] == REPORTED_VERSION


def test_switch_refuses_once_the_real_accelerate_is_imported(real_accelerate: str) -> None:
    code = """
import json, accelerate, accel
try:
    accel.use_as_accelerate()
    print(json.dumps({"error": None}))
except RuntimeError as error:
    print(json.dumps({"error": str(error)}))
"""
    error = _python(code, PYTHONPATH=real_accelerate)["error"]
    assert error and "already imported" in error and real_accelerate in error
    assert "ACCEL_AS_ACCELERATE=1" in error


def test_switch_warns_when_a_client_was_imported_first() -> None:
    code = """
import json, sys, types, warnings
sys.modules["transformers"] = types.ModuleType("transformers")  # imported before the switch
import accel
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    accel.use_as_accelerate()
print(json.dumps({"warnings": [str(w.message) for w in caught]}))
"""
    (message,) = _python(code)["warnings"]
    assert "after transformers was imported" in message and "before importing" in message


def test_environment_variable_works_from_interpreter_start(real_accelerate: str) -> None:
    installed = [Path(p) / STARTUP_HOOK.name for p in site.getsitepackages()]
    hook = next((p for p in installed if p.is_file()), None)
    assert hook is not None, f"{STARTUP_HOOK.name} is not installed in {installed}: re-sync"
    assert hook.read_text() == STARTUP_HOOK.read_text(), f"{hook} is stale: re-sync"
    out = _python(PROBE.format(setup=""), PYTHONPATH=real_accelerate, **{ENV_AS_ACCELERATE: "1"})
    assert out["on_at_start"] and not out["torch_at_start"]  # on, and torch not imported yet
    assert not out["real"] and out["file"].startswith(ACCEL_DIR)
    assert out["module_version"] == out["metadata_version"] == REPORTED_VERSION
    off = _python(PROBE.format(setup=""), PYTHONPATH=real_accelerate, **{ENV_AS_ACCELERATE: "0"})
    assert not off["on_at_start"] and off["real"]
    bad = _python(
        PROBE.format(setup=""), PYTHONPATH=real_accelerate, **{ENV_AS_ACCELERATE: "maybe"}
    )
    assert not bad["on_at_start"] and bad["real"]
    assert f"{ENV_AS_ACCELERATE}='maybe' is not a truth value" in bad["stderr"]


# transformers' and PEFT's own flows ------------------------------------------------------------


def _run_flows(out: Path, *flows: str, timeout: int = 300) -> None:
    proc = subprocess.run(
        [sys.executable, str(FLOWS), str(out), *flows],
        capture_output=True, text=True, timeout=timeout, env=_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]


@pytest.fixture(scope="module")
def flows(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAS_TRANSFORMERS:
        pytest.skip("transformers not installed")
    out = tmp_path_factory.mktemp("flows")
    _run_flows(out, "trainer", "bigmodel", *(["peft"] if HAS_PEFT else []))
    return out


def _json(out: Path, name: str, rank: int = 0) -> dict[str, Any]:
    return json.loads((out / f"{name}_rank{rank}.json").read_text())


def _load(path: Path) -> Any:
    return torch.load(path, weights_only=True)


def _assert_same_weights(a: dict, b: dict, exact: bool = True) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if exact:
            assert torch.equal(a[key], b[key]), key
        else:
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)


@needs_transformers
def test_trainer_trains_on_accel_and_loss_falls(flows: Path) -> None:
    result = _json(flows, "trainer")
    assert result["accelerator"] == "accel._accelerator"
    first, last = result["losses"][0], result["losses"][-1]
    assert len(result["losses"]) == 8 and last < first - 0.5


@needs_transformers
def test_trainer_evaluate_equals_the_loss_computed_by_hand(flows: Path) -> None:
    # TrainingArguments with use_cpu left False, 10 samples in batches of 4: a short last batch
    # padded with repeats changed the loss by 2%. Both sides sum 3 float32 batch losses in
    # another order: a few units of float32 rounding (6e-8) apart.
    result = _json(flows, "trainer")
    assert result["eval_loss"] == pytest.approx(result["eval_loss_by_hand"], rel=1e-6)


@needs_transformers
def test_trainer_resume_from_checkpoint_reaches_the_uninterrupted_weights(flows: Path) -> None:
    full, resumed = _load(flows / "trainer_full.pt"), _load(flows / "trainer_resumed.pt")
    _assert_same_weights(full, resumed)
    init = {k: v for k, v in _load(flows / "trainer_step4.pt").items()}
    assert any(not torch.equal(init[k], full[k]) for k in full)  # it did train after step 4


@needs_transformers
def test_trainer_gradient_accumulation_matches_the_full_batch(flows: Path) -> None:
    assert _json(flows, "trainer")["ga_steps"] == 4
    # 4 SGD steps of 2 micro-batches of 2 == 4 steps of batches of 4, up to float32 rounding:
    # the tiny Llama chains at most 12 matmuls (embedding, per decoder layer q/k/v, the
    # scores, their weighted sum, o, gate/up and down, the head) whose sums add at most 64
    # terms (hidden 32, intermediate 64, vocabulary 64, 4 x 16 tokens); see
    # accel_testkit.tolerance. A lost or doubled micro-batch is off by 0.1 or more.
    ga, whole = _load(flows / "trainer_ga.pt"), _load(flows / "trainer_sgd_whole.pt")
    start = _load(flows / "trainer_start.pt")
    assert_same_training(ga, whole, start, 4 * float32_error(layers=12, terms=64))


def _assert_same_outputs(flows: Path, tag: str) -> None:
    plain, other = _load(flows / "bigmodel_plain.pt"), _load(flows / f"bigmodel_{tag}.pt")
    for key in other:
        assert torch.equal(plain[key], other[key]), key


@needs_transformers
def test_from_pretrained_device_map_auto_with_nothing_else(flows: Path) -> None:
    # transformers measures the memory itself and passes float byte counts to accel
    device_map = _json(flows, "bigmodel")["auto"]
    assert "disk" not in device_map.values()  # all on one device: no map kept, as accelerate
    _assert_same_outputs(flows, "auto")


@needs_transformers
def test_from_pretrained_device_map_auto_spills_to_disk(flows: Path) -> None:
    device_map = _json(flows, "bigmodel")["auto_disk"]
    assert "disk" in device_map.values() and "cpu" in device_map.values()
    _assert_same_outputs(flows, "auto_disk")


@needs_transformers
def test_from_pretrained_hand_written_map_with_layers_on_disk(flows: Path) -> None:
    device_map = _json(flows, "bigmodel")["hand_disk"]
    assert device_map["model.layers.1"] == "disk" and device_map["lm_head"] == "disk"
    _assert_same_outputs(flows, "hand_disk")


@needs_transformers
def test_big_model_recipe_empty_init_tie_weights_load_and_dispatch(flows: Path) -> None:
    result = _json(flows, "bigmodel")
    assert result["recipe_meta_before"]
    assert "disk" in result["recipe_map"].values()
    _assert_same_outputs(flows, "recipe")


@pytest.mark.skipif(not (HAS_TRANSFORMERS and HAS_PEFT), reason="transformers/peft not installed")
def test_peft_lora_trains_with_trainer_and_reloads(flows: Path) -> None:
    result = _json(flows, "peft")
    assert result["losses"][-1] < result["losses"][0]
    assert result["lora_nonzero_b"] == 4 and result["trainable"] == 896
    base = _load(flows / "peft_base.pt")
    _assert_same_weights(base["before"], base["after"])  # LoRA leaves the base weights alone
    logits = _load(flows / "peft_logits.pt")
    assert torch.equal(logits["trained"], logits["reloaded"])


def test_what_the_trainer_passes_is_understood() -> None:
    from accel import AcceleratorState, PartialState, TorchDynamoPlugin

    # Trainer builds TorchDynamoPlugin(backend=None, ...) when it does not compile.
    assert TorchDynamoPlugin(backend=None, mode=None).backend == "no"
    state = PartialState(cpu=True)
    AcceleratorState._reset_state(reset_partial_state=False)  # the topology stays
    assert PartialState().initialized and PartialState().device == state.device
    AcceleratorState._reset_state(reset_partial_state=True)
    assert not PartialState._topology


def test_fsdp_checkpoint_files_need_an_fsdp2_run(tmp_path: Path) -> None:
    from accel import Accelerator
    from accel.utils import save_fsdp_model

    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="needs an Accelerator that runs FSDP2"):
        save_fsdp_model(None, accelerator, torch.nn.Linear(2, 2), tmp_path)
