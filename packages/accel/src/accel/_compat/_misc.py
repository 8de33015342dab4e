"""Small helpers behind `accel.state`, `accel.optimizer`, `accel.checkpointing`,
`accel.local_sgd`, `accel.launchers` and `accel.commands.*`."""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable
from typing import Any

import torch

from accel_parallel.checkpoint import custom_file


class ThreadLocalSharedDict(threading.local):
    """A dict shared by the objects of one thread (the state classes' shared storage)."""

    def __init__(self, thread_local: bool = False) -> None:
        self._storage: dict[str, Any] = {}

    def __get__(self, obj: Any, objtype: Any = None) -> dict[str, Any]:
        return self._storage

    def __set__(self, obj: Any, value: dict[str, Any]) -> None:
        self._storage = value


def do_nothing(*args: Any, **kwargs: Any) -> None:
    return None


def is_initialized() -> bool:
    """True once the process state was made (an Accelerator or PartialState was created)."""
    from accel_state import PartialState

    return PartialState._topology is not None


def move_to_device(state: Any, device: torch.device | str) -> Any:
    """`state` (an optimizer state, nested) with every tensor moved to `device`."""
    from accel_state import send_to_device

    return send_to_device(state, device)


def patch_optimizer_step(
    accelerated_optimizer: Any, method: Callable[..., Any]
) -> Callable[..., Any]:
    """`method` wrapped so that calling it marks the optimizer as having stepped."""

    def patched(*args: Any, **kwargs: Any) -> Any:
        accelerated_optimizer._accelerate_step_called = True
        return method(*args, **kwargs)

    return patched


def save_custom_state(
    obj: Any, path: str | os.PathLike[str], index: int = 0, save_on_each_node: bool = False
) -> None:
    """Save `obj.state_dict()` as ``custom_checkpoint_<index>.pkl`` in `path`."""
    from accel._compat._other import save

    save(obj.state_dict(), os.path.join(path, custom_file(index)), save_on_each_node)


def load_custom_state(obj: Any, path: str | os.PathLike[str], index: int = 0) -> None:
    """Load what `save_custom_state` wrote into `obj`."""
    obj.load_state_dict(
        torch.load(
            os.path.join(path, custom_file(index)),
            map_location="cpu",
            weights_only=False,
        )
    )


def _whole_state(name: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{name} is the internal step of Accelerator.save_state/load_state; call "
            "accelerator.save_state(output_dir) / accelerator.load_state(input_dir) instead."
        )

    fail.__name__ = name
    return fail


save_accelerator_state = _whole_state("save_accelerator_state")
load_accelerator_state = _whole_state("load_accelerator_state")


class LocalSGD:
    """Inside the block, each process steps alone; every `local_sgd_steps` calls of `step()`
    the model parameters are averaged across processes (and once more on exit)."""

    def __init__(
        self, accelerator: Any, model: torch.nn.Module, local_sgd_steps: int, enabled: bool = True
    ) -> None:
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.enabled = enabled and accelerator.num_processes > 1
        self.num_steps = 0

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self._sync()
            self._no_sync.__exit__(*exc)

    def step(self) -> None:
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync()

    def _sync(self) -> None:
        self.accelerator.wait_for_everyone()
        with torch.no_grad():
            for param in self.accelerator.unwrap_model(self.model).parameters():
                param.data = self.accelerator.reduce(param.data, reduction="mean")


def test_launch() -> int:
    """Run the self-test `accel test` runs."""
    from accel_cli.main import main

    return main(["test"])


def cli_command(name: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs the `accel` subcommand `name` on parsed arguments."""

    def run(args: argparse.Namespace) -> int:
        from accel_cli import familiar

        return getattr(familiar, name)(args)

    run.__name__ = name
    return run


def cli_parser(*path: str) -> Callable[..., argparse.ArgumentParser]:
    """A function returning the argument parser of the `accel` subcommand at `path`
    (the whole `accel` parser for an empty path)."""

    def parser(subparsers: Any = None) -> argparse.ArgumentParser:
        from accel_cli.familiar import build_parser

        found = build_parser()
        for step in path:
            sub = next(a for a in found._actions if isinstance(a, argparse._SubParsersAction))
            found = sub.choices[step]
        return found

    return parser


def cli_main(*words: str) -> Callable[..., int]:
    """`accel <words...>` as a function taking the remaining command-line words."""

    def main(argv: list[str] | None = None) -> int:
        import sys

        from accel_cli.main import main as cli

        rest = list(sys.argv[1:] if argv is None else argv)
        return cli([*words, *rest])

    return main


def write_basic_config(mixed_precision: str = "no", save_location: str | None = None) -> Any:
    """Write a default config file (for this machine: CPU, or its GPUs); an existing file is
    kept and False returned."""
    from pathlib import Path

    from accel_cli import default_config_path, default_file_values, write_config_file

    path = Path(save_location) if save_location else default_config_path()
    if path.exists():
        return False
    gpus = torch.cuda.device_count()
    values = default_file_values(
        mixed_precision=mixed_precision, cpu=gpus == 0, num_processes=max(gpus, 1)
    )
    return write_config_file(path, values)
