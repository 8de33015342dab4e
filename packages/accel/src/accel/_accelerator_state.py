"""AcceleratorState: the PartialState plus what the Accelerator chose (familiar name)."""

from __future__ import annotations

from typing import Any, ClassVar

from accel_state import PartialState


class AcceleratorState(PartialState):
    """The process topology plus the run's mixed precision, readable from anywhere.

    The Accelerator records its choices here when it is created; before that,
    ``mixed_precision`` is "no".
    """

    _choices: ClassVar[dict[str, Any]] = {}

    @property
    def mixed_precision(self) -> str:
        return str(AcceleratorState._choices.get("mixed_precision", "no"))

    @classmethod
    def _record(cls, **choices: Any) -> None:
        cls._choices = dict(choices)

    @classmethod
    def _reset_state(cls, destroy_process_group: bool = False) -> None:
        cls._choices = {}
        PartialState._reset_state(destroy_process_group)
