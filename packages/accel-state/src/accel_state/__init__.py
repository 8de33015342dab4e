"""accel-state: who am I. Process topology, device, process group, collectives, seeding, and
the RNG state a checkpoint keeps per process.

Importing this package does nothing: the environment is read and the process group created
when the first `PartialState()` is made.
"""

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
from accel_state._enums import (
    DistributedType,
    LoggerType,
    PrecisionType,
    ReduceOp,
    RNGType,
)
from accel_state._environment import (
    ENV_ACCEL_CONFIG,
    LaunchInfo,
    detect_launch,
    first_slurm_host,
)
from accel_state._hosts import address_toward, interface_of
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

__version__ = "0.1.0"

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
