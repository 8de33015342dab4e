"""accel-state: who am I. Process topology, device, process group, collectives, seeding, and
the RNG state a checkpoint keeps per process.

Importing this package does nothing: the environment is read and the process group created
when the first `PartialState()` is made. Names load lazily (PEP 562): `from accel_state import
X` imports only X's module, so the launcher's torch-free names (`accel_state.hosts`, the
environment reader, the enums) never pull torch in.

To export a name: add it to `__all__` and to `_EXPORTS` (name -> the module that defines it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker and an IDE see; at run time `__getattr__` loads them
    from accel_state._control import ProcessControl, split_range
    from accel_state._devices import (
        DeviceKind,
        accelerator_entry,
        device_entry,
        device_kinds,
        present_device_kinds,
        register_device_kind,
        unregister_device_kind,
    )
    from accel_state._enums import DistributedType, LoggerType, PrecisionType, ReduceOp, RNGType
    from accel_state._environment import (
        ENV_ACCEL_CONFIG,
        LaunchInfo,
        detect_launch,
        first_slurm_host,
    )
    from accel_state._ops import (
        CannotPadNestedTensorWarning,
        DistributedOperationException,
        broadcast,
        broadcast_object_list,
        concatenate,
        find_batch_size,
        gather,
        gather_object,
        honor_type,
        is_namedtuple,
        is_torch_tensor,
        pad_across_processes,
        recursively_apply,
        reduce,
        send_to_device,
    )
    from accel_state._random import set_seed, synchronize_rng_state, synchronize_rng_states
    from accel_state._rng_file import load_rng_file, rng_state, set_rng_state
    from accel_state._shortcuts import (
        on_last_process,
        on_local_main_process,
        on_main_process,
        on_process,
        wait_for_everyone,
    )
    from accel_state._state import (
        InitProcessGroupKwargs,
        PartialState,
        Topology,
        available_backends,
        resolved_launch_config,
    )
    from accel_state._threads import (
        declare_shared_state,
        set_shared_state,
        split_state_per_thread,
        state_is_per_thread,
    )
    from accel_state.hosts import address_toward, interface_of

__version__ = "0.1.0"

# name -> the module that defines it, grouped by module. One line per name keeps additions
# from different branches apart in a merge.
_EXPORTS: dict[str, str] = {
    "ProcessControl": "accel_state._control",
    "split_range": "accel_state._control",
    "DistributedType": "accel_state._enums",
    "LoggerType": "accel_state._enums",
    "PrecisionType": "accel_state._enums",
    "RNGType": "accel_state._enums",
    "ReduceOp": "accel_state._enums",
    "ENV_ACCEL_CONFIG": "accel_state._environment",
    "LaunchInfo": "accel_state._environment",
    "detect_launch": "accel_state._environment",
    "first_slurm_host": "accel_state._environment",
    "address_toward": "accel_state.hosts",
    "interface_of": "accel_state.hosts",
    "CannotPadNestedTensorWarning": "accel_state._ops",
    "DistributedOperationException": "accel_state._ops",
    "broadcast": "accel_state._ops",
    "broadcast_object_list": "accel_state._ops",
    "concatenate": "accel_state._ops",
    "find_batch_size": "accel_state._ops",
    "gather": "accel_state._ops",
    "gather_object": "accel_state._ops",
    "honor_type": "accel_state._ops",
    "is_namedtuple": "accel_state._ops",
    "is_torch_tensor": "accel_state._ops",
    "pad_across_processes": "accel_state._ops",
    "recursively_apply": "accel_state._ops",
    "reduce": "accel_state._ops",
    "send_to_device": "accel_state._ops",
    "DeviceKind": "accel_state._devices",
    "accelerator_entry": "accel_state._devices",
    "device_entry": "accel_state._devices",
    "device_kinds": "accel_state._devices",
    "present_device_kinds": "accel_state._devices",
    "register_device_kind": "accel_state._devices",
    "unregister_device_kind": "accel_state._devices",
    "set_seed": "accel_state._random",
    "synchronize_rng_state": "accel_state._random",
    "synchronize_rng_states": "accel_state._random",
    "load_rng_file": "accel_state._rng_file",
    "rng_state": "accel_state._rng_file",
    "set_rng_state": "accel_state._rng_file",
    "on_last_process": "accel_state._shortcuts",
    "on_local_main_process": "accel_state._shortcuts",
    "on_main_process": "accel_state._shortcuts",
    "on_process": "accel_state._shortcuts",
    "wait_for_everyone": "accel_state._shortcuts",
    "InitProcessGroupKwargs": "accel_state._state",
    "PartialState": "accel_state._state",
    "Topology": "accel_state._state",
    "available_backends": "accel_state._state",
    "resolved_launch_config": "accel_state._state",
    "declare_shared_state": "accel_state._threads",
    "set_shared_state": "accel_state._threads",
    "split_state_per_thread": "accel_state._threads",
    "state_is_per_thread": "accel_state._threads",
}

__all__ = [
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


def __getattr__(name: str) -> Any:
    """Import the module that defines `name` on first use, and keep the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accel_state' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
