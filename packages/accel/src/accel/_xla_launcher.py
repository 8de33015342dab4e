"""`notebook_launcher` on XLA devices: the function once per device of this host through
torch-xla's launcher (`xmp.spawn`, forked, as accelerate starts TPU workers in Colab and
Kaggle; here wherever torch-xla has a device: `PJRT_DEVICE` set or libtpu installed).

torch-xla 2.9 starts one process or one per device, so `num_processes` is honoured as that: None
is every device, 1 is one process (the function called here), and on XLA's CPU device
(`PJRT_DEVICE=CPU`) N is N devices (`CPU_NUM_DEVICES=N`). Other counts are refused, naming
the devices there are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from accel._compat._environment import environment
from accel_state import ENV_ACCEL_CONFIG
from accel_state.xla_env import XLAProcessCountError
from accel_state.xla_env import xla_nprocs as _xla_nprocs


class _XLAEntry:
    """What each XLA process calls: `function(*args)` (torch-xla passes the index first)."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function

    def __call__(self, index: int, *args: Any) -> None:
        self.function(*args)


def xla_nprocs(num_processes: int | None, environ: Mapping[str, str]) -> tuple[int | None, dict]:
    """torch-xla's `nprocs` for `num_processes`, and the variables that make it so
    (accel_state.xla_env's rule), or a ValueError worded for notebook_launcher."""
    try:
        return _xla_nprocs(num_processes, environ)
    except XLAProcessCountError as err:
        here = "one per device" if err.here is None else err.here
        raise ValueError(
            f"notebook_launcher(num_processes={num_processes}) on XLA: torch-xla starts 1 "
            f"process or one per device of this host ({here}); pass num_processes=1, or None "
            f"for every device."
        ) from None


def launch_on_xla(
    function: Callable[..., Any], args: tuple[Any, ...], num_processes: int | None, config: dict
) -> None:
    """Run `function(*args)` on this host's XLA devices (see the module docstring)."""
    from accel._accelerator_state import AcceleratorState

    if AcceleratorState._shared_state:
        raise ValueError(
            "To train on XLA devices from a notebook, the `Accelerator` should only be "
            "initialized inside your training function. Restart your notebook and make sure no "
            "cells initializes an `Accelerator`."
        )
    nprocs, env = xla_nprocs(num_processes, os.environ)
    import torch_xla

    if torch_xla._XLAC._xla_runtime_is_initialized():
        raise RuntimeError(
            "torch-xla's runtime was started in this process before notebook_launcher (an XLA "
            "tensor was made), so it cannot start workers. Restart the notebook and touch the "
            "XLA device only inside the training function."
        )
    import torch_xla.distributed.xla_multiprocessing as xmp

    with environment({**env, ENV_ACCEL_CONFIG: json.dumps(config)}):
        xmp.spawn(_XLAEntry(function), args=args, nprocs=nprocs, start_method="fork")
