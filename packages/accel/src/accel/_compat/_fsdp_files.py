"""accelerate's FSDP checkpoint-file functions, as transformers' Trainer calls them.

The Trainer writes its own checkpoints; under FSDP it hands the model and optimizer files to
these four functions. Each forwards to the prepared run's FSDP2 strategy (what `save_state`
uses too), so the files are those of accel's FSDP2: with `state_dict_type="SHARDED_STATE_DICT"`
one DCP folder per object (`pytorch_model_fsdp`, `optimizer_fsdp`), which loads on another
number of processes; with `FULL_STATE_DICT` one file (`pytorch_model_fsdp.bin`,
`optimizer.bin`) written by the main process. These are the names the Trainer looks for.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

MODEL_NAME = "pytorch_model"


def _name(base: str, index: int) -> str:
    return base if index == 0 else f"{base}_{index}"


def _strategy(accelerator: Any, what: str) -> Any:
    strategy = accelerator.strategy
    if strategy.name != "fsdp":
        raise ValueError(
            f"{what} needs an Accelerator that runs FSDP2 (fsdp_plugin=...); this one runs "
            f"{strategy.name!r}. Use accelerator.save_state / load_state instead."
        )
    return strategy


def _write_full(state: dict[str, torch.Tensor], path: Path) -> None:
    torch.save(state, f"{path}_fsdp.bin")


def _read_full(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(f"{path}_fsdp.bin", map_location="cpu", weights_only=True)


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
        model, folder, _name(MODEL_NAME, model_index),
        writer=accelerator.is_main_process, write_full=_write_full,
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
        model, Path(input_dir), _name(MODEL_NAME, model_index), read_full=_read_full
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
        getattr(optimizer, "optimizer", optimizer), folder, _name("optimizer", optimizer_index),
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
        _name("optimizer", optimizer_index), model=model,
    )  # fmt: skip
