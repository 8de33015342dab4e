"""save_state / load_state (filled in by the checkpointing module)."""

from __future__ import annotations


class CheckpointingMixin:
    def _init_checkpointing(self) -> None:
        self._custom_objects: list = []
