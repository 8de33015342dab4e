"""accel_state.xla_env: the one owner of the XLA opt-out and of torch-xla's process count."""

from __future__ import annotations

import pytest

from accel_state.xla_env import XLAProcessCountError, xla_nprocs, xla_opted_out, xla_requested


@pytest.mark.parametrize("value", ["0", "false", "No", "OFF"])
def test_the_opt_out_turns_xla_off(value: str) -> None:
    assert xla_opted_out({"USE_TORCH_XLA": value})
    assert not xla_requested({"USE_TORCH_XLA": value, "PJRT_DEVICE": "CPU"})


@pytest.mark.parametrize("environ", [{}, {"USE_TORCH_XLA": "1"}, {"USE_TORCH_XLA": "true"}])
def test_xla_stays_on_unless_turned_off(environ: dict[str, str]) -> None:
    assert not xla_opted_out(environ)


def test_process_count_is_one_or_every_device() -> None:
    assert xla_nprocs(None, {}) == (None, {})
    assert xla_nprocs(1, {"PJRT_DEVICE": "TPU"}) == (1, {})
    assert xla_nprocs(4, {"PJRT_DEVICE": "CPU"}) == (None, {"CPU_NUM_DEVICES": "4"})
    with pytest.raises(XLAProcessCountError) as err:
        xla_nprocs(2, {"PJRT_DEVICE": "NEURON"})
    assert (err.value.count, err.value.device, err.value.here) == (2, "NEURON", None)
    assert isinstance(err.value, ValueError)
