"""DeepSpeed "auto" filling follows accelerate's rules, so its configs train the same here.

Nothing here imports deepspeed: `fill_auto` only edits the config dict.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from torch import nn

from accel_parallel._deepspeed_fill import AUTO_GRADIENT_CLIPPING, fill_auto
from accel_parallel._deepspeed_plugin import DeepSpeedPlugin, DummyOptim, DummyScheduler


def _fill(plugin: DeepSpeedPlugin, **kwargs: Any) -> dict[str, Any]:
    run: dict[str, Any] = {
        "model": nn.Linear(2, 2),
        "optimizer": None,
        "scheduler": None,
        "micro_batch": 4,
        "accumulation_steps": 1,
        "data_parallel_size": 2,
    }
    return fill_auto(plugin, **{**run, **kwargs})


def test_auto_gradient_clipping_is_one_as_in_accelerate() -> None:
    assert AUTO_GRADIENT_CLIPPING == 1.0
    written = {"zero_optimization": {"stage": 2}, "gradient_clipping": "auto"}
    plugin = DeepSpeedPlugin(hf_ds_config=written)
    assert _fill(plugin)["gradient_clipping"] == 1.0
    assert "accelerate" in plugin.filled["gradient_clipping"][1]
    # a plugin without a config writes "auto" too (accelerate's default clips at 1.0)
    assert _fill(DeepSpeedPlugin())["gradient_clipping"] == 1.0


def test_written_or_absent_gradient_clipping_is_kept() -> None:
    assert _fill(DeepSpeedPlugin(gradient_clipping=0.0))["gradient_clipping"] == 0.0
    assert _fill(DeepSpeedPlugin(gradient_clipping=0.3))["gradient_clipping"] == 0.3
    written = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 1}})
    assert _fill(written)["gradient_clipping"] == 0.0  # absent: DeepSpeed's default, none
    both = {"zero_optimization": {"stage": 2}, "gradient_clipping": "auto"}
    assert _fill(DeepSpeedPlugin(hf_ds_config=both, gradient_clipping=0.5))[
        "gradient_clipping"
    ] == pytest.approx(0.5)


def test_scheduler_total_steps_count_each_process_shard() -> None:
    net = nn.Linear(2, 2)
    config = {
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": "auto",
                "warmup_max_lr": "auto",
                "warmup_num_steps": "auto",
                "total_num_steps": "auto",
            },
        },
    }

    def params(split: bool) -> dict[str, Any]:
        plugin = DeepSpeedPlugin(hf_ds_config=config)
        opt = DummyOptim(net.parameters(), lr=0.1, weight_decay=0.01)
        sched = DummyScheduler(opt, total_num_steps=9, warmup_num_steps=0)
        out = _fill(plugin, optimizer=opt, scheduler=sched, split_batches=split)
        return out["scheduler"]["params"]

    sharded = params(split=False)
    assert sharded["total_num_steps"] == 5  # ceil(9 / 2 processes)
    assert sharded["warmup_num_steps"] == 1  # DeepSpeed refuses 0
    assert sharded["warmup_min_lr"] == 0.0 and sharded["warmup_max_lr"] == 0.1
    assert params(split=True)["total_num_steps"] == 9  # every process sees every batch


def test_auto_micro_batch_and_train_batch_size() -> None:
    config = _fill(DeepSpeedPlugin(), micro_batch=3, accumulation_steps=2)
    assert config["train_micro_batch_size_per_gpu"] == 3
    assert config["train_batch_size"] == 3 * 2 * 2
    assert config["gradient_accumulation_steps"] == 2
    assert config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is False


def test_written_micro_batch_wins_over_the_loader_with_a_warning() -> None:
    written = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 2}
    with pytest.warns(UserWarning, match="batch size is 4 but the DeepSpeed config has 2"):
        config = _fill(DeepSpeedPlugin(hf_ds_config=written), micro_batch=4)
    assert config["train_micro_batch_size_per_gpu"] == 2
    assert config["train_batch_size"] == 2 * 1 * 2  # counted with the config's micro batch


def test_written_accumulation_steps_win_over_the_accelerator_with_a_warning() -> None:
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("the DeepSpeed strategy is built only where deepspeed is installed")
    from torch import device

    from accel_parallel import ProcessInfo
    from accel_parallel._deepspeed import DeepSpeedStrategy

    written = {"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 4}
    strategy = DeepSpeedStrategy(ProcessInfo(device("cpu")), DeepSpeedPlugin(hf_ds_config=written))
    with pytest.warns(UserWarning, match="Accelerator has 2 but the DeepSpeed config has 4"):
        assert strategy.accumulation_steps(2) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # agreeing: no warning
        assert strategy.accumulation_steps(4) == 4
    auto = DeepSpeedPlugin(hf_ds_config={**written, "gradient_accumulation_steps": "auto"})
    assert DeepSpeedStrategy(ProcessInfo(device("cpu")), auto).accumulation_steps(2) == 2
