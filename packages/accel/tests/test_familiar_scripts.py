"""What accelerate's distributed test scripts (test_utils/scripts) rely on, as plain calls.

tools/compat/run_accelerate_suite.py --scripts launches those scripts against accel; each test
here is the call one of them makes, so that a regression shows without the scripts.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest
import torch

from accel import Accelerator, AcceleratorState, PartialState
from accel.launchers import notebook_launcher
from accel.utils import DistributedType


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch: pytest.MonkeyPatch):
    # notebook_launcher refuses once bitsandbytes is imported (as accelerate's does): another
    # test file run earlier in this process may have imported it; the tests here start clean
    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


# -- AcceleratorState._reset_state (external_deps/test_metrics.py) ---------------------------
def test_reset_state_keeps_the_topology_by_default() -> None:
    acc = Accelerator(cpu=True)
    acc.state._reset_state()
    assert PartialState._topology is not None  # accelerate's reset_partial_state=False
    assert acc.is_local_main_process and acc.is_main_process  # read through PartialState
    assert AcceleratorState._shared_state == {}
    with pytest.raises(AttributeError, match="This happens if `AcceleratorState._reset_state"):
        acc.num_processes  # noqa: B018  (what accelerate forgets with its own record)
    again = Accelerator(cpu=True)
    assert again.num_processes == 1 and acc.num_processes == 1


def test_reset_state_can_forget_the_topology_too() -> None:
    state = Accelerator(cpu=True).state
    AcceleratorState._reset_state(True)  # accelerate's positional reset_partial_state
    assert PartialState._topology is None
    with pytest.raises(AttributeError, match="has no attribute `is_main_process`"):
        state.is_main_process  # noqa: B018
    assert Accelerator(cpu=True).state.initialized


# -- assigning to the state (test_distributed_data_loop.py) ----------------------------------
def test_distributed_type_can_be_assigned_and_reads_back() -> None:
    acc = Accelerator(cpu=True)
    original = acc.state.distributed_type
    acc.state.distributed_type = DistributedType.FSDP
    assert acc.state.distributed_type == DistributedType.FSDP == acc.distributed_type
    assert AcceleratorState().distributed_type == DistributedType.FSDP  # shared, as accelerate's
    assert PartialState().distributed_type == original  # the topology itself is unchanged
    acc.state.distributed_type = original
    assert acc.distributed_type == original
    acc.state.distributed_type = "MULTI_CPU"
    assert acc.distributed_type is DistributedType.MULTI_CPU
    with pytest.raises(ValueError):
        acc.state.distributed_type = "TWO_GPUS"
    AcceleratorState._reset_state()
    assert Accelerator(cpu=True).distributed_type == original  # a reset forgets the assignment


def test_own_names_can_be_assigned_but_not_the_topology() -> None:
    acc = Accelerator(cpu=True)
    acc.state.someotherthing = "MyValue"
    assert acc.state.someotherthing == "MyValue"
    with pytest.raises(AttributeError, match="num_processes is where the processes were launched"):
        acc.state.num_processes = 4
    with pytest.raises(AttributeError, match="mixed_precision is read-only"):
        acc.state.mixed_precision = "bf16"
    with pytest.raises(AttributeError, match=r"Pass Accelerator\(fsdp_plugin=...\)"):
        acc.state.fsdp_plugin = object()
    assert acc.num_processes == 1 and acc.mixed_precision == "no"


# -- load_state(map_location=...) ------------------------------------------------------------
def test_load_state_checks_map_location_as_accelerate(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(2, 2))
    acc.save_state(tmp_path / "ckpt")
    with torch.no_grad():
        model.weight.zero_()
    with pytest.raises(TypeError, match="Unsupported optimizer map location"):
        acc.load_state(tmp_path / "ckpt", map_location="cuda:3")
    for where in ("cpu", "on_device", None):
        acc.load_state(tmp_path / "ckpt", map_location=where)
        assert model.weight.abs().sum() > 0


# -- notebook_launcher (scripts/test_notebook.py) --------------------------------------------
def _write_rank(folder: str) -> None:
    state = PartialState()
    Path(folder, f"rank{state.process_index}").write_text(str(state.num_processes))


def _fail_until_restarted(folder: str) -> None:
    # every worker of the first attempt fails; the agent restarts the group
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        raise RuntimeError("first attempt fails")
    _write_rank(folder)


def _port() -> str:
    from accel_state.testing import free_port

    return str(free_port())


@pytest.mark.parametrize("rdzv_backend", ["static", "c10d"])
def test_notebook_launcher_takes_the_rendezvous_backend(tmp_path: Path, rdzv_backend: str) -> None:
    notebook_launcher(
        _write_rank, (str(tmp_path),), num_processes=2, use_port=_port(), rdzv_backend=rdzv_backend
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
    assert (tmp_path / "rank1").read_text() == "2"


def test_notebook_launcher_restarts_up_to_max_restarts(tmp_path: Path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    with pytest.raises(ChildFailedError, match="first attempt fails"):
        notebook_launcher(
            _fail_until_restarted, (str(tmp_path),), num_processes=2, use_port=_port()
        )
    notebook_launcher(
        _fail_until_restarted,
        (str(tmp_path),),
        num_processes=2,
        use_port=_port(),
        max_restarts=1,
        monitor_interval=0.05,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]


def test_notebook_launcher_refuses_after_bitsandbytes_was_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))
    with pytest.raises(RuntimeError, match="Please keep these imports") as err:
        notebook_launcher(_write_rank, ("unused",), num_processes=2)
    assert "* `bitsandbytes`" in str(err.value)


def test_notebook_launcher_refuses_after_an_accelerator_was_made() -> None:
    Accelerator(cpu=True)
    with pytest.raises(ValueError, match="should only be initialized inside your training"):
        notebook_launcher(_write_rank, ("unused",), num_processes=2)


def test_notebook_launcher_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="Unknown mixed_precision mode: 'fp4'"):
        notebook_launcher(_write_rank, ("unused",), num_processes=2, mixed_precision="fp4")
    with pytest.raises(ValueError, match="node_rank must be less than the number of nodes"):
        notebook_launcher(_write_rank, ("unused",), num_processes=2, node_rank=1)
