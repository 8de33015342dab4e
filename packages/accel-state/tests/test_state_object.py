"""The PartialState object as accelerate scripts use it: a reset state names the fix, notes
can be written on it, ACCELERATE_TORCH_DEVICE names the device, and the enums hold
accelerate's members."""

from __future__ import annotations

import pytest
import torch

from accel_state import DistributedType, PartialState, RNGType, synchronize_rng_state
from accel_state._environment import ENV_TORCH_DEVICE, device_override

pytestmark = pytest.mark.usefixtures("single_process_state")  # tests/conftest.py


def test_a_reset_state_names_the_reset_and_the_fix() -> None:
    state = PartialState()
    assert state.num_processes == 1
    with pytest.raises(AttributeError, match="'PartialState' object has no attribute 'other'"):
        state.other  # noqa: B018
    PartialState._reset_state()
    with pytest.raises(AttributeError, match=r"`PartialState` object has no attribute `device`"):
        state.device  # noqa: B018
    with pytest.raises(AttributeError, match=r"This happens if `PartialState._reset_state\(\)`"):
        state.num_processes  # noqa: B018
    assert PartialState().num_processes == 1  # made again: readable again


def test_notes_are_shared_until_reset_and_the_topology_stays_immutable() -> None:
    state = PartialState()
    state.note = "mine"
    assert PartialState().note == "mine"
    with pytest.raises(AttributeError, match="immutable"):
        state.num_processes = 4
    PartialState._reset_state()
    assert not hasattr(PartialState(), "note")


def test_accelerate_torch_device_names_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert device_override({ENV_TORCH_DEVICE: " "}) is None
    monkeypatch.setenv(ENV_TORCH_DEVICE, "cpu:3")
    assert PartialState().device == torch.device("cpu", 3)
    PartialState._reset_state()
    monkeypatch.setenv(ENV_TORCH_DEVICE, "no-such-device")
    with pytest.raises(ValueError, match="ACCELERATE_TORCH_DEVICE='no-such-device'"):
        PartialState()


def test_enums_hold_accelerates_members() -> None:
    for name in ("MULTI_SDAA", "MULTI_NEURON", "MEGATRON_LM"):
        assert DistributedType(name).value == name
    for kind in ("mlu", "sdaa", "musa", "npu", "xpu", "hpu", "neuron", "xla"):
        assert RNGType(kind).value == kind


def test_device_generators_sync_and_xla_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    synchronize_rng_state("xpu")  # one process: nothing to synchronize
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    with pytest.raises(ValueError, match=r"synchronize_rng_state\('xla'\) is not supported"):
        synchronize_rng_state("xla")


def test_state_debug_turns_the_shape_checks_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel_state._ops import debug_mode

    monkeypatch.delenv("ACCEL_DEBUG_MODE", raising=False)
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE", raising=False)
    state = PartialState()
    assert state.debug is False and not debug_mode()
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "true")
    assert state.debug is True
    state.debug = False  # the code's choice wins over the variable
    assert not debug_mode()
