"""The public API is declared once and changes only on purpose."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import torch

import accel_state

EXPECTED = [
    "ENV_ACCEL_CONFIG",
    "CannotPadNestedTensorWarning",
    "DeviceKind",
    "DistributedOperationException",
    "DistributedType",
    "InitProcessGroupKwargs",
    "LaunchInfo",
    "LoggerType",
    "PartialState",
    "PrecisionType",
    "ProcessControl",
    "RNGType",
    "ReduceOp",
    "Topology",
    "accelerator_entry",
    "address_toward",
    "available_backends",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "declare_shared_state",
    "detect_launch",
    "device_entry",
    "device_kinds",
    "find_batch_size",
    "first_slurm_host",
    "gather",
    "gather_object",
    "honor_type",
    "interface_of",
    "is_namedtuple",
    "is_torch_tensor",
    "load_rng_file",
    "on_last_process",
    "on_local_main_process",
    "on_main_process",
    "on_process",
    "pad_across_processes",
    "present_device_kinds",
    "recursively_apply",
    "reduce",
    "register_device_kind",
    "resolved_launch_config",
    "rng_state",
    "send_to_device",
    "set_rng_state",
    "set_seed",
    "set_shared_state",
    "split_range",
    "split_state_per_thread",
    "state_is_per_thread",
    "synchronize_rng_state",
    "synchronize_rng_states",
    "unregister_device_kind",
    "wait_for_everyone",
]


def test_all_is_the_declared_api() -> None:
    assert accel_state.__all__ == EXPECTED
    assert len(set(EXPECTED)) == len(EXPECTED)  # in ruff's order: classes, then functions


def test_every_name_resolves() -> None:
    for name in accel_state.__all__:
        assert getattr(accel_state, name) is not None, name


def test_import_imports_no_sibling_and_touches_nothing() -> None:
    code = (
        "import os, sys; before = dict(os.environ); import accel_state, torch; "
        "import torch.distributed as dist; "
        "bad = [m for m in sys.modules if m.startswith('accel_') and m != 'accel_state' "
        "and not m.startswith('accel_state.')]; "
        "assert not bad, bad; assert dict(os.environ) == before; "
        "assert not dist.is_initialized(); assert not torch.cuda.is_initialized(); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_rng_file_round_trip(tmp_path: Path) -> None:
    """What rng_state captures, written as accelerate writes it, restores every generator."""
    random.seed(1)
    torch.manual_seed(1)
    state = accel_state.rng_state(step=7)
    torch.save(state, tmp_path / "random_states_0.pkl")
    expected = (random.random(), torch.rand(3))
    random.seed(2)
    torch.manual_seed(2)
    loaded = accel_state.load_rng_file(tmp_path / "random_states_0.pkl")
    assert loaded["step"] == 7
    accel_state.set_rng_state(loaded)
    assert random.random() == expected[0]
    assert torch.equal(torch.rand(3), expected[1])


def test_names_load_lazily_and_the_network_rule_is_torch_free() -> None:
    """`import accel_state.hosts` and the launcher's names import no torch; `dir()` lists the
    whole API before any of it is loaded, and every exported name comes from its module."""
    code = (
        "import sys; import accel_state.hosts; import accel_state; "
        "from accel_state import DistributedType, address_toward, interface_of, detect_launch; "
        "assert 'torch' not in sys.modules, sorted(sys.modules); "
        "assert set(accel_state.__all__) <= set(dir(accel_state)); "
        "assert address_toward is accel_state.hosts.address_toward; "
        "assert set(accel_state._EXPORTS) == set(accel_state.__all__); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_an_unknown_name_is_an_attribute_error() -> None:
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = accel_state.nope  # type: ignore[attr-defined]
