"""AcceleratorState: the PartialState plus what the Accelerator chose (familiar name)."""

from __future__ import annotations

from typing import Any, ClassVar

from accel_state import DistributedType, PartialState, declare_shared_state, set_shared_state

# What accelerate's AcceleratorState holds in its own record: its `_reset_state()` forgets them
# (reading one raises until an Accelerator is made again) while the PartialState lives on.
_FORGOTTEN_ON_RESET = frozenset(
    {
        "device",
        "distributed_type",
        "num_processes",
        "process_index",
        "local_process_index",
        "backend",
        "mixed_precision",
        "fsdp_plugin",
        "deepspeed_plugins",
        "deepspeed_plugin",
    }
)
# Assigning these would only make the state lie: the processes run where they were launched.
_TOPOLOGY = frozenset(
    {
        "device",
        "default_device",
        "num_processes",
        "process_index",
        "local_process_index",
        "local_num_processes",
        "node_rank",
        "backend",
        "launcher",
    }
)
_ENGINE_CHOICES = frozenset({"fsdp_plugin", "deepspeed_plugins", "deepspeed_plugin"})


class _SharedStateView:
    """`AcceleratorState._shared_state`, as accelerate's scripts test it: empty until an
    Accelerator (or AcceleratorState) is made and again after `_reset_state()`."""

    def __get__(self, obj: object, owner: type | None = None) -> dict[str, Any]:
        topo = PartialState._topology
        if topo is None or not AcceleratorState._live:
            return {}
        return {"topology": topo, **AcceleratorState._choices, **AcceleratorState._assigned}


def _forgettable(name: str) -> property:
    """The topology's property `name`, unreadable after `AcceleratorState._reset_state()`."""
    inherited = getattr(PartialState, name)

    def read(self: AcceleratorState) -> Any:
        if not AcceleratorState._live:
            raise AttributeError(name)  # __getattr__ words it
        return inherited.fget(self)

    return property(read, doc=inherited.__doc__)


class AcceleratorState(PartialState):
    """The process topology plus the run's mixed precision, readable from anywhere.

    The Accelerator records its choices here when it is created; before that,
    ``mixed_precision`` is "no". As in accelerate, ``distributed_type`` and names of the
    caller's own may be assigned (the value is what the state reports until the next
    `_reset_state`); the topology (device, ranks, backend) and the engine's plugins may not.
    """

    _choices: ClassVar[dict[str, Any]] = {}
    _assigned: ClassVar[dict[str, Any]] = {}
    _live: ClassVar[bool] = False  # made, and not reset since
    _shared_state = _SharedStateView()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not AcceleratorState._live:
            set_shared_state(AcceleratorState, "_live", True)

    device = _forgettable("device")
    num_processes = _forgettable("num_processes")
    process_index = _forgettable("process_index")
    local_process_index = _forgettable("local_process_index")
    backend = _forgettable("backend")

    @property
    def initialized(self) -> bool:
        return AcceleratorState._live and PartialState._topology is not None

    @property
    def mixed_precision(self) -> str:
        self._check_live("mixed_precision")
        return str(AcceleratorState._choices.get("mixed_precision", "no"))

    @property
    def distributed_type(self) -> DistributedType:
        """As accelerate reports it: DEEPSPEED or FSDP when the run's engine is one, else the
        topology's (NO, MULTI_CPU, MULTI_GPU, ...); an assigned value wins."""
        if "distributed_type" in AcceleratorState._assigned:
            return AcceleratorState._assigned["distributed_type"]
        self._check_live("distributed_type")
        strategy = AcceleratorState._choices.get("strategy")
        topology = self.topology.distributed_type
        return topology if strategy is None else strategy.distributed_type(topology)

    @property
    def fsdp_plugin(self) -> Any:
        """The FSDP2 plugin of the run (None when it does not shard with FSDP2)."""
        self._check_live("fsdp_plugin")
        strategy = AcceleratorState._choices.get("strategy")
        return None if strategy is None else strategy.fsdp_plugin

    @property
    def deepspeed_plugins(self) -> dict[str, Any] | None:
        """The DeepSpeed plugins by name (None when the run does not use DeepSpeed)."""
        self._check_live("deepspeed_plugins")
        return AcceleratorState._choices.get("deepspeed_plugins")

    @property
    def deepspeed_plugin(self) -> Any:
        """The active DeepSpeed plugin: the one the next `prepare` builds its engine with."""
        plugins = self.deepspeed_plugins
        if not plugins:
            return None
        return next((p for p in plugins.values() if p.selected), None)

    def get_deepspeed_plugin(self, name: str) -> Any:
        plugins = self.deepspeed_plugins or {}
        if name not in plugins:
            raise ValueError(f"no DeepSpeed plugin named {name!r}; known: {sorted(plugins)}.")
        return plugins[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make plugin `name` the active one (the familiar way to prepare a second model
        with other DeepSpeed settings)."""
        strategy = AcceleratorState._choices.get("strategy")
        if not self.deepspeed_plugins or strategy is None:
            raise ValueError(
                "select_deepspeed_plugin: this run has no DeepSpeed plugins; pass "
                "Accelerator(deepspeed_plugins={name: DeepSpeedPlugin(...)})."
            )
        strategy.select_engine_plugin(name)

    # -- assignment and reading, as accelerate's shared-dict state allows ------------------
    def __setattr__(self, name: str, value: Any) -> None:
        """`state.distributed_type = ...` and the caller's own names are recorded (shared by
        every AcceleratorState until `_reset_state`); the topology and the engine refuse."""
        if name in _TOPOLOGY:
            raise AttributeError(
                f"AcceleratorState.{name} is where the processes were launched "
                f"({getattr(PartialState(), name)!r}) and cannot be assigned. Launch with other "
                f"settings (accel launch --num_processes / --cpu, or Accelerator(cpu=True))."
            )
        if name in _ENGINE_CHOICES:
            raise AttributeError(
                f"AcceleratorState.{name} cannot be assigned: the engine is chosen when the "
                f"Accelerator is made. Pass Accelerator({name.rstrip('s')}=...) instead."
            )
        if name == "distributed_type":
            value = DistributedType(value)
        elif hasattr(type(self), name):  # mixed_precision, is_main_process, methods, ...
            raise AttributeError(
                f"AcceleratorState.{name} is read-only (as in accelerate); the Accelerator's "
                f"arguments set it."
            )
        AcceleratorState._assigned[name] = value

    def __getattr__(self, name: str) -> Any:
        assigned = AcceleratorState._assigned
        if name in assigned:
            return assigned[name]
        if not AcceleratorState._live and name in _FORGOTTEN_ON_RESET:
            raise AttributeError(
                f"`AcceleratorState` object has no attribute `{name}`. This happens if "
                f"`AcceleratorState._reset_state()` was called and an `Accelerator` or "
                f"`PartialState` was not made again afterwards; create one before using the state."
            )
        return super().__getattr__(name)

    def _check_live(self, name: str) -> None:
        if not AcceleratorState._live:
            raise AttributeError(name)  # __getattr__ words it

    @classmethod
    def _record(cls, **choices: Any) -> None:
        set_shared_state(AcceleratorState, "_choices", dict(choices))
        set_shared_state(AcceleratorState, "_live", True)

    @classmethod
    def _reset_state(
        cls, reset_partial_state: bool = False, *, destroy_process_group: bool = False
    ) -> None:
        """Forget the run's choices and what was assigned. As in accelerate, the topology
        (PartialState) stays unless `reset_partial_state=True`; `destroy_process_group=True`
        destroys the process group and so forgets the topology too."""
        set_shared_state(AcceleratorState, "_choices", {})
        set_shared_state(AcceleratorState, "_assigned", {})
        set_shared_state(AcceleratorState, "_live", False)
        if reset_partial_state or destroy_process_group:
            PartialState._reset_state(destroy_process_group)


# One record per process, or per replica thread where torch-xla runs them as threads
# (accel_state.split_state_per_thread), as the PartialState's topology.
declare_shared_state(AcceleratorState, "_choices", dict)
declare_shared_state(AcceleratorState, "_assigned", dict)
declare_shared_state(AcceleratorState, "_live", lambda: False)
