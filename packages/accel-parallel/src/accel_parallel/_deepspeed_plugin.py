"""`DeepSpeedPlugin`: the DeepSpeed settings users write, turned into one DeepSpeed config dict.

The fields are the familiar ones. A JSON config (`hf_ds_config`: a dict, a file path, a JSON
string or an `HfDeepSpeedConfig`) and the fields meet by one rule: a field fills the config's
"auto" or missing entry, agrees with a written one, or is an error naming both values. Values
the Accelerator knows (micro batch, accumulation steps, mixed precision, DummyOptim /
DummyScheduler hyper-parameters) fill the remaining "auto" entries at `prepare`
(`_deepspeed_fill`); nothing written is overridden. Importing this module does not import
deepspeed.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch

_OFFLOAD_DEVICES = ("none", "cpu", "nvme")
INSTALL = "pip install accel-parallel[deepspeed]"


def import_deepspeed() -> Any:
    """deepspeed, imported on first use; a clear error naming the install when missing."""
    try:
        import deepspeed
    except ImportError as err:
        raise ImportError(
            f"The DeepSpeed strategy needs the deepspeed package ({err}); install it with "
            f"`{INSTALL}`."
        ) from err
    return deepspeed


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def load_config(source: Any) -> dict[str, Any]:
    """A DeepSpeed config dict from a dict (copied), a JSON file path, a JSON string or an
    object with a `.config` dict (HfDeepSpeedConfig)."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    if hasattr(source, "config") and isinstance(source.config, Mapping):
        return copy.deepcopy(dict(source.config))
    if isinstance(source, str | os.PathLike):
        text = os.fspath(source)
        if os.path.isfile(text):
            with open(text, encoding="utf-8") as f:
                return json.load(f)
        if text.lstrip().startswith("{"):
            return json.loads(text)
        raise ValueError(
            f"hf_ds_config={text!r} is neither an existing JSON file nor a JSON object string; "
            f"pass a dict, the path of a DeepSpeed JSON config, or its JSON text."
        )
    raise TypeError(
        f"hf_ds_config must be a dict, a path, a JSON string or an HfDeepSpeedConfig, not "
        f"{type(source).__name__}."
    )


class HfDeepSpeedConfig:
    """A DeepSpeed config dict with look-ups by dotted key (the familiar helper)."""

    def __init__(self, config_file_or_dict: Any) -> None:
        self.config = load_config(config_file_or_dict)
        self._stage = self.get_value("zero_optimization.stage", -1)

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        return find_node(self.config, ds_key_long)

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        node, key = find_node(self.config, ds_key_long)
        return default if node is None else node.get(key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        node, key = find_node(self.config, ds_key_long)
        if node is None or key not in node:
            if must_exist:
                raise ValueError(f"the DeepSpeed config has no entry {ds_key_long!r}.")
            return
        del node[key]

    def is_true(self, ds_key_long: str) -> bool:
        value = self.get_value(ds_key_long)
        return value is not None and _as_bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        value = self.get_value(ds_key_long)
        return value is not None and not _as_bool(value)

    def is_zero2(self) -> bool:
        return self._stage == 2

    def is_zero3(self) -> bool:
        return self._stage == 3

    def is_offload(self) -> bool:
        devices = {
            self.get_value("zero_optimization.offload_optimizer.device"),
            self.get_value("zero_optimization.offload_param.device"),
        }
        return bool(devices & {"cpu", "nvme"})


def find_node(config: dict[str, Any], dotted: str) -> tuple[dict[str, Any] | None, str]:
    *parents, key = dotted.split(".")
    node: Any = config
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None, key
    return (node if isinstance(node, dict) else None), key


def set_value(config: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, key = dotted.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[key] = value


class DummyOptim(torch.optim.Optimizer):
    """Stands for the optimizer written in the DeepSpeed config; `prepare` returns the one
    the engine builds from that section (its "auto" lr / weight_decay come from here)."""

    def __init__(self, params: Any, lr: float = 1e-3, weight_decay: float = 0.0, **kwargs: Any):
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, **kwargs})
        self.params = [p for group in self.param_groups for p in group["params"]]

    def step(self, closure: Any = None) -> None:
        raise RuntimeError(
            "DummyOptim only stands for the optimizer of the DeepSpeed config; pass it to "
            "accelerator.prepare() and step the optimizer that prepare returns."
        )


class DummyScheduler:
    """Stands for the scheduler written in the DeepSpeed config (or built by
    `lr_scheduler_callable(optimizer)`); the engine steps it once per optimizer step."""

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Any = None,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs

    def step(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            "DummyScheduler only stands for the scheduler of the DeepSpeed config; pass it to "
            "accelerator.prepare() and use the scheduler that prepare returns."
        )

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]


@dataclasses.dataclass
class DeepSpeedPlugin:
    """DeepSpeed ZeRO settings for `Accelerator(deepspeed_plugin=...)`.

    - hf_ds_config: a DeepSpeed config (dict, JSON path, JSON string, HfDeepSpeedConfig);
      without one a config is made from the fields below.
    - zero_stage: 0, 1, 2 (default) or 3.
    - gradient_accumulation_steps: a number is counted by the Accelerator too (one that differs
      from the Accelerator's wins, with a warning, as in accelerate); None: the Accelerator's.
    - gradient_clipping: clip every step to this norm; 0.0: no clipping. None or "auto":
      1.0, as accelerate fills it (a loop's `clip_grad_norm_(max_norm)` wins, with a warning).
    - offload_optimizer_device / offload_param_device: "none", "cpu" or "nvme" (with
      offload_optimizer_nvme_path / offload_param_nvme_path); parameters only under ZeRO-3.
    - zero3_init_flag: `zero3_init()` partitions parameters as the model is built (ZeRO-3).
    - zero3_save_16bit_model: get_state_dict / save_model gather the full 16-bit weights.
    - transformer_moe_cls_names: comma-separated class names made ZeRO-3 leaf modules.
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | str | None = None
    gradient_clipping: float | str | None = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool = False
    msamp_opt_level: str | None = None

    def __post_init__(self) -> None:
        if _as_bool(self.enable_msamp) or self.msamp_opt_level is not None:
            raise ValueError(
                "DeepSpeedPlugin(enable_msamp / msamp_opt_level): MS-AMP fp8 is not supported by "
                "accel's DeepSpeed strategy; remove them and use mixed_precision='bf16'."
            )
        written = self.hf_ds_config is not None
        if written and not isinstance(getattr(self.hf_ds_config, "config", None), dict):
            self.hf_ds_config = HfDeepSpeedConfig(self.hf_ds_config)  # a copy of a dict
        # One dict with the config object (transformers' Trainer fills "auto" values through
        # the HfDeepSpeedConfig it passes, after the plugin is made).
        config = self.hf_ds_config.config if written else self._config_from_fields()
        self.deepspeed_config: dict[str, Any] = config
        self.filled: dict[str, tuple[Any, str]] = {}  # key -> (value, where it came from)
        if written:
            self._merge_fields()
        self._check()
        self._selected = False

    # -- building and checking -------------------------------------------------------------
    def _config_from_fields(self) -> dict[str, Any]:
        stage = 2 if self.zero_stage is None else int(self.zero_stage)
        zero: dict[str, Any] = {"stage": stage}
        for kind in ("optimizer", "param"):
            device = getattr(self, f"offload_{kind}_device") or "none"
            section: dict[str, Any] = {"device": device}
            if device == "nvme":
                section["nvme_path"] = getattr(self, f"offload_{kind}_nvme_path")
            zero[f"offload_{kind}"] = section
        zero["stage3_gather_16bit_weights_on_model_save"] = _as_bool(self.zero3_save_16bit_model)
        steps = self.gradient_accumulation_steps
        return {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto" if steps in (None, "auto") else int(steps),
            "gradient_clipping": "auto"
            if self.gradient_clipping in (None, "auto")
            else float(self.gradient_clipping),
            "zero_optimization": zero,
        }

    def _merge_fields(self) -> None:
        """Fields given next to a written config fill its "auto" entries or must agree."""
        pairs = {
            "zero_stage": "zero_optimization.stage",
            "gradient_accumulation_steps": "gradient_accumulation_steps",
            "gradient_clipping": "gradient_clipping",
            "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
            "offload_param_device": "zero_optimization.offload_param.device",
            "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
            "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
            "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        }
        for field, key in pairs.items():
            value = getattr(self, field)
            if value is not None and value != "auto":
                self.fill_match(key, source=f"DeepSpeedPlugin.{field}", **{key: value})

    def _check(self) -> None:
        stage = self.get_value("zero_optimization.stage", 0)
        if stage == "auto" or int(stage) not in (0, 1, 2, 3):
            raise ValueError(
                f"zero_optimization.stage={stage!r}: accepted stages are 0, 1, 2 and 3."
            )
        self.zero_stage = int(stage)
        for kind in ("optimizer", "param"):
            device = self.get_value(f"zero_optimization.offload_{kind}.device", "none")
            device = "none" if device is None else str(device).lower()
            if device not in _OFFLOAD_DEVICES:
                raise ValueError(
                    f"offload_{kind}_device={device!r}: accepted {list(_OFFLOAD_DEVICES)}."
                )
            if device == "nvme" and not self.get_value(
                f"zero_optimization.offload_{kind}.nvme_path"
            ):
                raise ValueError(
                    f"offload_{kind}_device='nvme' needs offload_{kind}_nvme_path (a folder on "
                    f"a fast local disk)."
                )
            setattr(self, f"offload_{kind}_device", device)
        if self.offload_param_device != "none" and self.zero_stage != 3:
            warnings.warn(
                f"offload_param_device={self.offload_param_device!r} with ZeRO stage "
                f"{self.zero_stage}: DeepSpeed offloads parameters only under stage 3 and "
                f"ignores it here, so the parameters stay on the device. Set zero_stage=3 to "
                f"offload them, or drop offload_param_device.",
                stacklevel=3,
            )
        if self.offload_optimizer_device != "none" and self.zero_stage == 0:
            raise ValueError(
                f"offload_optimizer_device={self.offload_optimizer_device!r} needs ZeRO stage 1, 2 "
                f"or 3; this config has stage 0."
            )
        self.zero3_init_flag = _as_bool(self.zero3_init_flag)
        if self.zero3_init_flag and self.zero_stage != 3:
            warnings.warn(  # accelerate's behaviour: the flag is switched off
                f"zero3_init_flag=True partitions parameters at construction, which is ZeRO-3; "
                f"this config has stage {self.zero_stage}, so the flag is set to False. Set "
                f"zero_stage=3 to partition at construction.",
                stacklevel=3,
            )
            self.zero3_init_flag = False
        gather = self.get_value("zero_optimization.stage3_gather_16bit_weights_on_model_save")
        self.zero3_save_16bit_model = gather not in (None, "auto") and _as_bool(gather)

    # -- the familiar config helpers ---------------------------------------------------------
    def is_auto(self, ds_key_long: str) -> bool:
        return self.get_value(ds_key_long) == "auto"

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        node, key = find_node(self.deepspeed_config, ds_key_long)
        return default if node is None else node.get(key, default)

    def fill_match(
        self,
        ds_key_long: str,
        mismatches: list[str] | None = None,
        must_match: bool = True,
        source: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Fill `ds_key_long` from kwargs[ds_key_long] where the config says "auto" or has no
        entry; a written value that differs is an error naming both (or, with a `mismatches`
        list, is appended to it)."""
        if ds_key_long not in kwargs:
            return
        value = kwargs[ds_key_long]
        current = self.get_value(ds_key_long)
        if current is None or current == "auto":
            set_value(self.deepspeed_config, ds_key_long, value)
            self.filled[ds_key_long] = (value, source or "the Accelerator")
            return
        if not must_match or _same(current, value):
            return
        text = (
            f"the DeepSpeed config has {ds_key_long}={current!r} but {source or 'the Accelerator'} "
            f"gives {value!r}"
        )
        if mismatches is not None:
            mismatches.append(text)
            return
        raise ValueError(
            f'{text}. Make them agree, or write "auto" in the config to take the second.'
        )

    def deepspeed_config_process(
        self,
        prefix: str = "",
        mismatches: list[str] | None = None,
        config: dict[str, Any] | None = None,
        must_match: bool = True,
        **kwargs: Any,
    ) -> None:
        """`fill_match` every key of `config` (the whole config by default) found in kwargs."""
        top = mismatches is None
        mismatches = [] if top else mismatches
        for key, value in (self.deepspeed_config if config is None else config).items():
            if isinstance(value, dict):
                self.deepspeed_config_process(
                    prefix + key + ".", mismatches, value, must_match, **kwargs
                )
            else:
                self.fill_match(prefix + key, mismatches, must_match=must_match, **kwargs)
        if top and mismatches:
            raise ValueError("; ".join(mismatches) + ".")

    def set_mixed_precision(self, mixed_precision: str) -> str:
        """Make the config's fp16/bf16 sections agree with the Accelerator's mode; returns
        the mode the engine runs. A config that enables a dtype itself wins over the default
        "no"; one that contradicts an explicit fp16/bf16 is an error naming both."""
        mode = str(getattr(mixed_precision, "value", mixed_precision)).lower()
        if mode not in ("no", "fp16", "bf16"):
            raise ValueError(
                f"mixed_precision={mode!r} is not supported by the DeepSpeed strategy; accepted: "
                f"'no', 'bf16', 'fp16' (the engine keeps fp32 master weights itself)."
            )
        enabled = {
            dtype: self.get_value(f"{dtype}.enabled") for dtype in ("fp16", "bf16")
        }  # None, "auto", or a written bool
        written_on = [d for d, v in enabled.items() if v not in (None, "auto") and _as_bool(v)]
        if len(written_on) > 1:
            raise ValueError("the DeepSpeed config enables both fp16 and bf16; enable one.")
        if mode == "no" and written_on:
            mode = written_on[0]
        for dtype, value in enabled.items():
            want = dtype == mode
            if value in (None, "auto"):
                if want or value == "auto":
                    set_value(self.deepspeed_config, f"{dtype}.enabled", want)
                    self.filled[f"{dtype}.enabled"] = (want, f"mixed_precision={mode!r}")
            elif _as_bool(value) != want:
                raise ValueError(
                    f"the DeepSpeed config has {dtype}.enabled={value!r} but the Accelerator's "
                    f'mixed_precision is {mode!r}; make them agree (or write "auto").'
                )
        return mode

    # -- ZeRO-3 construction -------------------------------------------------------------------
    def is_zero3_init_enabled(self) -> bool:
        return bool(self.zero3_init_flag) and self.zero_stage == 3

    @contextlib.contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Iterator[None]:
        """Switch `zero3_init_flag` for the block (the familiar toggle)."""
        saved, self.zero3_init_flag = self.zero3_init_flag, enable
        try:
            yield
        finally:
            self.zero3_init_flag = saved

    def zero3_init(self) -> contextlib.AbstractContextManager[Any]:
        """Build the model inside this block to partition its parameters as they are made
        (`deepspeed.zero.Init`), when zero3_init_flag is set under ZeRO-3; else a no-op.
        Create the Accelerator first (it starts the process group and sets the dtype)."""
        if not self.is_zero3_init_enabled():
            return contextlib.nullcontext()
        deepspeed = import_deepspeed()
        config = copy.deepcopy(self.deepspeed_config)
        for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):  # fmt: skip
            config.pop(key, None)  # not needed to partition; may still be "auto" here
        for dtype in ("fp16", "bf16"):
            if config.get(dtype, {}).get("enabled") == "auto":
                config[dtype]["enabled"] = False
        config["train_micro_batch_size_per_gpu"] = 1
        return deepspeed.zero.Init(config_dict_or_path=config)

    # -- selection among several plugins ---------------------------------------------------------
    @property
    def selected(self) -> bool:
        return self._selected

    @selected.setter
    def selected(self, value: bool) -> None:
        self._selected = bool(value)

    def select(self, _from_accelerator_state: bool = False) -> None:
        if not _from_accelerator_state:
            raise ValueError(
                "select a plugin through the Accelerator's state: "
                "accelerator.state.select_deepspeed_plugin(name)."
            )
        self._selected = True

    def _unselect(self) -> None:
        self._selected = False

    @classmethod
    def from_launch_config(cls, section: Mapping[str, Any]) -> DeepSpeedPlugin:
        """The plugin from a `deepspeed_config` section (accelerate's YAML keys)."""
        keys = {
            "deepspeed_config_file": "hf_ds_config",
            "zero_stage": "zero_stage",
            "gradient_accumulation_steps": "gradient_accumulation_steps",
            "gradient_clipping": "gradient_clipping",
            "offload_optimizer_device": "offload_optimizer_device",
            "offload_param_device": "offload_param_device",
            "offload_optimizer_nvme_path": "offload_optimizer_nvme_path",
            "offload_param_nvme_path": "offload_param_nvme_path",
            "zero3_init_flag": "zero3_init_flag",
            "zero3_save_16bit_model": "zero3_save_16bit_model",
            "deepspeed_moe_layer_cls_names": "transformer_moe_cls_names",
        }
        launcher_only = {
            "deepspeed_hostfile",
            "deepspeed_exclusion_filter",
            "deepspeed_inclusion_filter",
            "deepspeed_multinode_launcher",
        }
        kwargs: dict[str, Any] = {}
        for key, value in section.items():
            if key in launcher_only or value is None:
                continue
            if key not in keys:
                raise ValueError(
                    f"deepspeed_config key {key!r} is not known; known: "
                    f"{sorted([*keys, *launcher_only])}."
                )
            kwargs[keys[key]] = value
        if "zero_stage" in kwargs:
            kwargs["zero_stage"] = int(kwargs["zero_stage"])
        for flag in ("zero3_init_flag", "zero3_save_16bit_model"):
            if flag in kwargs:
                kwargs[flag] = _as_bool(kwargs[flag])
        for field in ("gradient_accumulation_steps", "gradient_clipping"):
            if kwargs.get(field) is not None and str(kwargs[field]) != "auto":
                kwargs[field] = (int if field.startswith("gradient_acc") else float)(kwargs[field])
        return cls(**kwargs)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return _as_bool(a) == _as_bool(b)
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b
