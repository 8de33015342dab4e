"""Fill a DeepSpeed config's "auto" entries from what the run knows, visibly.

Each filled entry is recorded in `plugin.filled` with where its value came from; a written
entry is never changed. A written micro batch size that differs from the DataLoader's wins
with a warning naming both, as in accelerate (the Accelerator has already made a written
gradient_accumulation_steps its own); other contradictions are errors naming both values; an
"auto" left with nothing to fill it is an error naming the key and the fix.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from torch import nn

from accel_parallel._deepspeed_plugin import DeepSpeedPlugin, DummyOptim, DummyScheduler

_HIDDEN_SIZE_KEYS = {
    "zero_optimization.reduce_bucket_size": lambda h: h * h,
    "zero_optimization.stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "zero_optimization.stage3_param_persistence_threshold": lambda h: 10 * h,
}
_SCHEDULER_LR_KEYS = ("warmup_max_lr", "max_lr", "lr")
AUTO_GRADIENT_CLIPPING = 1.0  # what "gradient_clipping": "auto" means, in accelerate as here


def fill_auto(
    plugin: DeepSpeedPlugin,
    *,
    model: nn.Module | None,
    optimizer: Any,
    scheduler: Any,
    micro_batch: int | None,
    accumulation_steps: int,
    data_parallel_size: int,
    split_batches: bool = False,
) -> dict[str, Any]:
    """Fill `plugin.deepspeed_config` in place for one engine and return it.

    The rules are accelerate's, so a config written for it trains the same here."""
    fill = plugin.fill_match
    fill(
        "gradient_accumulation_steps",
        source="the Accelerator's gradient_accumulation_steps",
        gradient_accumulation_steps=accumulation_steps,
    )
    _fill_batch(plugin, micro_batch, accumulation_steps, data_parallel_size)
    if plugin.is_auto("gradient_clipping"):
        fill(
            "gradient_clipping",
            source=f'"auto" clips at {AUTO_GRADIENT_CLIPPING}, as accelerate does (write a '
            "number, or DeepSpeedPlugin(gradient_clipping=0.0) for no clipping)",
            gradient_clipping=AUTO_GRADIENT_CLIPPING,
        )
    elif plugin.get_value("gradient_clipping") is None:
        fill(
            "gradient_clipping",
            source="absent from the config: no clipping (DeepSpeed's default)",
            gradient_clipping=0.0,
        )
    key = "zero_optimization.stage3_gather_16bit_weights_on_model_save"
    if plugin.is_auto(key):
        fill(key, source="DeepSpeedPlugin.zero3_save_16bit_model", **{key: False})
    _fill_optimizer(plugin, optimizer)
    # a DummyScheduler's total_num_steps counts batches of the whole loader; each process
    # steps through its shard of it, unless the batches are split
    shards = 1 if split_batches else data_parallel_size
    _fill_scheduler(plugin, optimizer, scheduler, shards)
    _fill_hidden_size(plugin, model)
    left = _auto_keys(plugin.deepspeed_config)
    if left:
        raise ValueError(
            f'the DeepSpeed config still has "auto" for {left}: nothing the Accelerator knows '
            f"fills them. Write values for them in the config."
        )
    config = plugin.deepspeed_config
    if optimizer is not None and not isinstance(optimizer, DummyOptim):
        config.setdefault("zero_allow_untested_optimizer", True)  # a torch optimizer of the code
    return plugin.deepspeed_config


def _fill_batch(plugin: DeepSpeedPlugin, micro: int | None, steps: int, world: int) -> None:
    key = "train_micro_batch_size_per_gpu"
    if plugin.is_auto(key) or plugin.get_value(key) is None:
        if micro is None:
            raise ValueError(
                'the DeepSpeed config has train_micro_batch_size_per_gpu="auto" but no '
                "DataLoader with a batch_size was prepared before or with the model. Pass the "
                "training DataLoader to the same accelerator.prepare() call as the model, or "
                "write train_micro_batch_size_per_gpu in the config."
            )
        plugin.fill_match(key, source="the prepared DataLoader's batch size", **{key: micro})
    elif micro is not None and int(plugin.get_value(key)) != micro:
        warnings.warn(
            f"train_micro_batch_size_per_gpu: the prepared DataLoader's batch size is {micro} "
            f"but the DeepSpeed config has {plugin.get_value(key)}; the engine counts the "
            f'config\'s (as accelerate does). Make them agree, or write "auto" in the config.',
            stacklevel=2,
        )
    micro = int(plugin.get_value(key))
    plugin.fill_match(
        "train_batch_size",
        source=f"micro batch {micro} x accumulation {steps} x {world} data-parallel processes",
        train_batch_size=micro * steps * world,
    )


def _fill_optimizer(plugin: DeepSpeedPlugin, optimizer: Any) -> None:
    section = plugin.get_value("optimizer")
    if isinstance(optimizer, DummyOptim):
        if not isinstance(section, dict):
            raise ValueError(
                "DummyOptim stands for the optimizer of the DeepSpeed config, but the config has "
                'no "optimizer" section; add one, or pass a torch optimizer instead.'
            )
        values = {"lr": optimizer.lr, "weight_decay": optimizer.weight_decay, **optimizer.kwargs}
        for name, value in values.items():
            plugin.fill_match(
                f"optimizer.params.{name}", source=f"DummyOptim({name}=...)",
                **{f"optimizer.params.{name}": _plain(value)},
            )  # fmt: skip
    elif optimizer is not None and isinstance(section, dict):
        raise ValueError(
            f'the DeepSpeed config has an "optimizer" section ({section.get("type")!r}) and the '
            f"code passed {type(optimizer).__name__} to prepare(); keep one: remove the section, "
            f"or pass accel.utils.DummyOptim(model.parameters(), lr=...)."
        )


def _fill_scheduler(plugin: DeepSpeedPlugin, optimizer: Any, scheduler: Any, shards: int) -> None:
    section = plugin.get_value("scheduler")
    if isinstance(scheduler, DummyScheduler):
        if scheduler.lr_scheduler_callable is not None:
            return
        if not isinstance(section, dict):
            raise ValueError(
                "DummyScheduler stands for the scheduler of the DeepSpeed config, but the config "
                'has no "scheduler" section; add one, or give DummyScheduler('
                "lr_scheduler_callable=...)."
            )
        lr = getattr(optimizer, "lr", None) or optimizer.param_groups[0]["lr"]
        values = {
            "warmup_min_lr": 0.0,
            "warmup_num_steps": max(1, int(scheduler.warmup_num_steps)),
            **{k: lr for k in _SCHEDULER_LR_KEYS},
            **scheduler.kwargs,
        }
        if scheduler.total_num_steps is not None:
            values["total_num_steps"] = math.ceil(int(scheduler.total_num_steps) / shards)
        params = section.get("params", {})
        for name, value in values.items():
            if name in params:
                plugin.fill_match(
                    f"scheduler.params.{name}", source=f"DummyScheduler / DummyOptim ({name})",
                    **{f"scheduler.params.{name}": _plain(value)},
                )  # fmt: skip
    elif scheduler is not None and isinstance(section, dict):
        raise ValueError(
            f'the DeepSpeed config has a "scheduler" section ({section.get("type")!r}) and the '
            f"code passed {type(scheduler).__name__} to prepare(); keep one: remove the section, "
            f"or pass accel.utils.DummyScheduler(optimizer, ...)."
        )


def _fill_hidden_size(plugin: DeepSpeedPlugin, model: nn.Module | None) -> None:
    wanted = [k for k in _HIDDEN_SIZE_KEYS if plugin.is_auto(k)]
    if not wanted:
        return
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None)
    if hidden is None and getattr(config, "hidden_sizes", None):
        hidden = max(config.hidden_sizes)
    if hidden is None:
        raise ValueError(
            f'the DeepSpeed config has "auto" for {wanted}, which are derived from the model\'s '
            f"config.hidden_size, and this model has none; write numbers for them."
        )
    for key in wanted:
        plugin.fill_match(
            key,
            source=f"model.config.hidden_size={hidden}",
            **{key: _HIDDEN_SIZE_KEYS[key](hidden)},
        )


def _auto_keys(config: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in config.items():
        if isinstance(value, dict):
            out += _auto_keys(value, f"{prefix}{key}.")
        elif value == "auto":
            out.append(prefix + key)
    return out


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
