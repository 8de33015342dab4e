"""Checkpoints as a component: the Accelerator holds a `Checkpointer` and delegates
save_state, load_state, the hooks, automatic naming and save_model to it.

- `_checkpointer`: the Checkpointer (registration, save, load, export);
- `_write`: the files of one save, on every process;
- `_commit`: the marker, the rename into place, the asynchronous save's background half;
- `_load`: checking a folder against this run, restoring each process's state;
- `_naming`: automatic checkpoint names, the newest complete one, rotation.
"""

from accel._checkpoint._checkpointer import Checkpointer

__all__ = ["Checkpointer"]
