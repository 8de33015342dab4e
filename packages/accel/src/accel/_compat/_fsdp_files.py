"""accelerate's FSDP checkpoint-file functions, as transformers' Trainer calls them.

The Trainer writes its own checkpoints; under FSDP it hands the model and optimizer files to
these four functions. Each forwards to the prepared run's FSDP2 strategy (what `save_state`
uses too), so the files are those accelerate writes: with `state_dict_type="SHARDED_STATE_DICT"`
one DCP folder per object (`pytorch_model_fsdp_0`, `optimizer_0`), which loads on another
number of processes; with `FULL_STATE_DICT` one file (`pytorch_model_fsdp.bin`,
`optimizer.bin`) written by the main process. These are the names the Trainer looks for.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from accel._io import read_weights, weights_writer
from accel_parallel.checkpoint import model_name, optimizer_name


def _strategy(accelerator: Any, what: str) -> Any:
    strategy = accelerator.strategy
    if strategy.fsdp_plugin is None:
        raise ValueError(
            f"{what} needs an Accelerator that runs FSDP2 (fsdp_plugin=...); this one runs "
            f"{strategy.name!r}. Use accelerator.save_state / load_state instead."
        )
    return strategy


def save_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: torch.nn.Module,
    output_dir: str | os.PathLike[str],
    model_index: int = 0,
) -> None:
    """Write `model`'s FSDP2 weights under `output_dir` (every process calls it)."""
    strategy = _strategy(accelerator, "save_fsdp_model")
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    strategy.save_model_files(
        model, folder, model_name(model_index),
        writer=accelerator.is_main_process, write_full=weights_writer(False),
    )  # fmt: skip
    accelerator.wait_for_everyone()


def load_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: torch.nn.Module,
    input_dir: str | os.PathLike[str],
    model_index: int = 0,
) -> None:
    """Load what `save_fsdp_model` wrote into the prepared `model` (every process calls it)."""
    strategy = _strategy(accelerator, "load_fsdp_model")
    strategy.load_model_files(
        model, Path(input_dir), model_name(model_index), read_full=read_weights
    )


def save_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    output_dir: str | os.PathLike[str],
    optimizer_index: int = 0,
) -> None:
    """Write the optimizer state of the FSDP2 `model` under `output_dir`."""
    strategy = _strategy(accelerator, "save_fsdp_optimizer")
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    strategy.save_optimizer_files(
        getattr(optimizer, "optimizer", optimizer), folder, optimizer_name(optimizer_index),
        writer=accelerator.is_main_process, model=model,
    )  # fmt: skip
    accelerator.wait_for_everyone()


def load_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    input_dir: str | os.PathLike[str],
    optimizer_index: int = 0,
) -> None:
    """Load what `save_fsdp_optimizer` wrote into `optimizer`."""
    strategy = _strategy(accelerator, "load_fsdp_optimizer")
    strategy.load_optimizer_files(
        getattr(optimizer, "optimizer", optimizer), Path(input_dir),
        optimizer_name(optimizer_index), model=model,
    )  # fmt: skip
