"""What the environment says about XLA devices (torch-xla): whether a run opted out, whether a
run that names no strategy runs on XLA, and how many processes torch-xla's launcher starts.

One owner for each rule, read by the strategies (accel-parallel), `accel launch --tpu`
(accel-cli), `notebook_launcher` and accelerate's probes (the umbrella), and seeding here.
Public and torch-free: it looks at the environment and at what is installed, imports nothing
(torch-xla only where a TPU's chip count is asked, in a process that runs on XLA anyway).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

__all__ = [
    "ENV_CPU_NUM_DEVICES",
    "ENV_PJRT_DEVICE",
    "ENV_USE_TORCH_XLA",
    "XLAProcessCountError",
    "xla_nprocs",
    "xla_opted_out",
    "xla_requested",
]

# accelerate's opt-out ("0" keeps a machine with torch-xla off XLA), torch-xla's runtime device
# ("TPU", "CPU", "CUDA"), and the device count of XLA's CPU device.
ENV_USE_TORCH_XLA = "USE_TORCH_XLA"
ENV_PJRT_DEVICE = "PJRT_DEVICE"
ENV_CPU_NUM_DEVICES = "CPU_NUM_DEVICES"
_OFF = ("0", "false", "no", "off")


def xla_opted_out(environ: Mapping[str, str]) -> bool:
    """Whether the run turned XLA off (`USE_TORCH_XLA` 0, false, no or off, any case)."""
    return str(environ.get(ENV_USE_TORCH_XLA, "1")).lower() in _OFF


def xla_requested(environ: Mapping[str, str]) -> bool:
    """Whether a run that names no strategy runs on XLA: torch-xla is installed, the run did
    not opt out, and there is an XLA device (`PJRT_DEVICE` names one, or libtpu is
    installed). Imports nothing."""
    if xla_opted_out(environ):
        return False
    if importlib.util.find_spec("torch_xla") is None:
        return False
    return bool(environ.get(ENV_PJRT_DEVICE)) or importlib.util.find_spec("libtpu") is not None


class XLAProcessCountError(ValueError):
    """A process count torch-xla's launcher cannot start: it starts one process or one per
    device. `here` is this host's TPU chip count (None on another device); each caller words
    the fix in its own terms (a flag, an argument)."""

    def __init__(self, count: int, device: str, here: int | None) -> None:
        super().__init__(f"num_processes {count} on XLA device {device or 'TPU'}")
        self.count, self.device, self.here = count, device, here


def xla_nprocs(count: int | None, environ: Mapping[str, str]) -> tuple[int | None, dict[str, str]]:
    """torch-xla's `nprocs` for `count` processes, and the variables that make it so: None or
    1 as given; on XLA's CPU device N devices (`CPU_NUM_DEVICES=N`, nprocs None: one per
    device); on a TPU its chip count (None). Anything else raises XLAProcessCountError."""
    if count is None or count == 1:
        return count, {}
    device = environ.get(ENV_PJRT_DEVICE, "").upper()
    if count > 1 and device == "CPU":
        return None, {ENV_CPU_NUM_DEVICES: str(count)}
    here = None
    if device in ("", "TPU"):
        from torch_xla._internal import tpu

        here = int(tpu.num_local_processes())
        if count == here:
            return None, {}
    raise XLAProcessCountError(count, device, here)
