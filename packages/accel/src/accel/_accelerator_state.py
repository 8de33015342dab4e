"""AcceleratorState: the PartialState plus what the Accelerator chose (familiar name)."""

from __future__ import annotations

from typing import Any, ClassVar

from accel_state import DistributedType, PartialState


class AcceleratorState(PartialState):
    """The process topology plus the run's mixed precision, readable from anywhere.

    The Accelerator records its choices here when it is created; before that,
    ``mixed_precision`` is "no".
    """

    _choices: ClassVar[dict[str, Any]] = {}

    @property
    def mixed_precision(self) -> str:
        return str(AcceleratorState._choices.get("mixed_precision", "no"))

    @property
    def distributed_type(self) -> DistributedType:
        """As accelerate reports it: DEEPSPEED or FSDP when the run's engine is one, else the
        topology's (NO, MULTI_CPU, MULTI_GPU, ...)."""
        name = getattr(AcceleratorState._choices.get("strategy"), "name", "")
        engine = {"deepspeed": DistributedType.DEEPSPEED, "fsdp": DistributedType.FSDP}.get(name)
        return engine or self.topology.distributed_type

    @property
    def fsdp_plugin(self) -> Any:
        """The FSDP2 plugin of the run (None when it does not shard with FSDP2)."""
        strategy = AcceleratorState._choices.get("strategy")
        if getattr(strategy, "name", "") != "fsdp":
            return None
        return getattr(strategy, "plugin", None)

    @property
    def deepspeed_plugins(self) -> dict[str, Any] | None:
        """The DeepSpeed plugins by name (None when the run does not use DeepSpeed)."""
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
        strategy.select_plugin(name)

    @classmethod
    def _record(cls, **choices: Any) -> None:
        cls._choices = dict(choices)

    @classmethod
    def _reset_state(
        cls, destroy_process_group: bool = False, *, reset_partial_state: bool = True
    ) -> None:
        """Forget the run's choices and, unless `reset_partial_state=False`, the topology."""
        cls._choices = {}
        if reset_partial_state:
            PartialState._reset_state(destroy_process_group)
