"""Opt-in at `prepare`: the predicted per-device peak of a training step against the memory.

Off unless asked for: `accelerator.memory_check = "80GiB"` (or `"auto"`: the CUDA device's
total memory) before `prepare`, or the environment variable `ACCEL_MEMORY_CHECK` with the same
values. `prepare` then estimates one step of each new model with its optimizer and the
engine it is about to be wrapped in (`accel_parallel.memory`, fake tensors, nothing
allocated), on an example batch collated from the first samples of the DataLoader passed to
the same `prepare` call, and warns when the peak exceeds the memory, naming the cheapest
change that fits (a smaller micro-batch, activation checkpointing, resharding, offload).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch import nn

from accel_state import device_entry

MEMORY_CHECK_ENV = "ACCEL_MEMORY_CHECK"


def requested_memory(value: Any, device: torch.device) -> int | None:
    """Bytes to check against: the attribute's value, else the environment's; None when off."""
    value = value if value is not None else os.environ.get(MEMORY_CHECK_ENV)
    if value in (None, "", "0", False):
        return None
    from accel_parallel.memory import parse_memory

    if value == "auto":
        total = device_entry(device).total_memory(device)
        if total is None:
            warnings.warn(
                f"memory_check='auto' needs a device that reports its memory, such as a CUDA "
                f"GPU (this process runs on {device}); give the size instead, e.g. "
                f"memory_check='80GiB'.",
                stacklevel=3,
            )
        return total
    try:
        return parse_memory(value)
    except ValueError as err:
        raise ValueError(f"memory_check / {MEMORY_CHECK_ENV}: {err}") from None


def example_batch(objects: tuple[Any, ...], half: bool = False) -> Any:
    """One batch collated from the first samples of the first map-style DataLoader among
    `objects` (half of its batch size with `half`); None when there is none."""
    for obj in objects:
        if not isinstance(obj, torch.utils.data.DataLoader) or obj.batch_size is None:
            continue
        dataset = obj.dataset
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            continue
        size = min(obj.batch_size, len(dataset))
        size = max(1, size // 2) if half else size
        return obj.collate_fn([dataset[i] for i in range(size)])
    return None


def check_at_prepare(accelerator: Any, models: list[nn.Module], optimizers: list[Any],
                     objects: tuple[Any, ...]) -> None:  # fmt: skip
    """Warn (main process) when a model's predicted peak exceeds the memory; see the module
    doc. Every process takes part (a fake process group is made collectively)."""
    limit = requested_memory(getattr(accelerator, "memory_check", None), accelerator.device)
    if limit is None or not models:
        return
    engine = accelerator.strategy.memory_engine()
    batch = example_batch(objects)
    if engine is None or batch is None:
        why = "its engine is not estimated" if engine is None else "no map-style DataLoader"
        warnings.warn(f"memory check skipped: {why} in this prepare call.", stacklevel=3)
        return
    import torch.distributed as dist

    group = None
    if dist.is_initialized() and engine[0] == "fsdp2":
        group = dist.new_group(backend="fake")
    if not accelerator.is_main_process:
        return
    optimizer = type(optimizers[0]).__name__.lower() if optimizers else "adamw"
    for model in models:
        _check_one(accelerator, model, optimizer, batch, objects, engine, limit, group)


def _check_one(accelerator: Any, model: nn.Module, optimizer: str, batch: Any,
               objects: tuple, engine: tuple, limit: int, group: Any) -> None:  # fmt: skip
    from accel_parallel.memory import OPTIMIZERS, estimate_training_memory

    name, options = engine
    common = {
        "world_size": accelerator.num_processes,
        "engines": [name],
        "mixed_precision": accelerator.mixed_precision
        if accelerator.mixed_precision in ("bf16", "fp16")
        else "no",
        "optimizer": optimizer if optimizer in OPTIMIZERS else "adamw",
        "group": group,
    }
    rows = estimate_training_memory(
        model, batch=batch, activation_checkpointing=(False, True), **common
    )
    current = next(r for r in rows if _matches(r, options))
    if current.peak_bytes <= limit:
        return
    # ranked by bytes moved per step, then without recomputation first
    changes = [
        (r.step_cost, r.activation_checkpointing, r.label(), r.peak_bytes)
        for r in rows
        if r.peak_bytes <= limit
    ]
    smaller = example_batch(objects, half=True)
    if smaller is not None:
        flat = {k: v for k, v in options.items() if k != "activation_checkpointing"}
        half = estimate_training_memory(
            model, batch=smaller, activation_checkpointing=options["activation_checkpointing"],
            offload=[flat.get("offload", False)],
            reshard_after_forward=[flat.get("reshard_after_forward", True)], **common,
        )  # fmt: skip
        if half[0].peak_bytes <= limit:
            # two micro-steps per optimizer step: the same reduction (accumulated without
            # sync), but parameters gathered per micro-step where the engine shards them
            regather = 2 if name in ("fsdp2", "zero3") else 1
            cost = half[0].step_cost * regather
            changes.append((cost, half[0].activation_checkpointing, "half the micro-batch",
                            half[0].peak_bytes))  # fmt: skip
    advice = "nothing of micro-batch / 2, activation checkpointing, reshard or offload fits"
    if changes:
        *_, label, peak = min(changes)
        advice = f"the cheapest change that fits: {label} (peak {_size(peak)})"
    warnings.warn(
        f"predicted peak {_size(current.peak_bytes)} per device for {type(model).__name__} "
        f"with {current.label()} on {current.world_size} process(es) exceeds the device "
        f"memory {_size(limit)}; {advice}.",
        stacklevel=4,
    )


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _matches(row: Any, options: dict[str, Any]) -> bool:
    return all(getattr(row, key) == value for key, value in options.items())
