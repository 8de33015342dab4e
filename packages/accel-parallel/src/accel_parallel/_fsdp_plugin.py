"""`FullyShardedDataParallelPlugin`: the FSDP settings users write, resolved for FSDP2.

The fields are the familiar ones. FSDP1-only settings (`fsdp_version=1`, `sharding_strategy`,
`backward_prefetch`, `use_orig_params`, ...) are translated to FSDP2 with a notice naming each
mapping, or refused with an error naming the field; FSDP1 itself is not built and nothing
falls back to DDP.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

_SHARDING = {
    # FSDP1 strategy -> reshard_after_forward under FSDP2
    "FULL_SHARD": True,
    "SHARD_GRAD_OP": False,
}
_REFUSED_SHARDING = {
    "NO_SHARD": "NO_SHARD keeps full replicas: that is DDP; run without an fsdp plugin",
    "HYBRID_SHARD": "hybrid sharding is set by a 2-D device mesh: pass Accelerator("
    "parallelism_config=ParallelismConfig(dp_replicate_size=..., dp_shard_size=...))",
    "_HYBRID_SHARD_ZERO2": "hybrid sharding is set by a 2-D device mesh: pass Accelerator("
    "parallelism_config=ParallelismConfig(dp_replicate_size=..., dp_shard_size=...)) with "
    "reshard_after_forward=False",
}
_WRAP_POLICIES = ("transformer_based_wrap", "size_based_wrap", "no_wrap")
_STATE_DICT_TYPES = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
# numbers accelerate's config files use for enums
_SHARDING_BY_NUMBER = {1: "FULL_SHARD", 2: "SHARD_GRAD_OP", 3: "NO_SHARD", 4: "HYBRID_SHARD"}
_STATE_DICT_BY_NUMBER = {1: "FULL_STATE_DICT", 2: "LOCAL_STATE_DICT", 3: "SHARDED_STATE_DICT"}


def _enum_name(value: Any, by_number: Mapping[int, str]) -> str:
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return by_number.get(int(value), str(value))
    return str(getattr(value, "name", value)).upper()


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _state_dict_name(value: Any) -> str:
    """The name SHARDED_STATE_DICT or FULL_STATE_DICT from a name, number or StateDictType."""
    state = _enum_name(value or "SHARDED_STATE_DICT", _STATE_DICT_BY_NUMBER)
    if not state.endswith("_STATE_DICT"):
        state += "_STATE_DICT"
    if state not in _STATE_DICT_TYPES:
        raise ValueError(
            f"state_dict_type={value!r} is not supported; accepted: "
            f"{list(_STATE_DICT_TYPES)} (LOCAL_STATE_DICT is FSDP1-only)."
        )
    return state


def _offload_flag(value: Any) -> bool:
    """cpu_offload as a bool: torch's offload policy objects say it by their class (an
    `OffloadPolicy()` means no offload, though the object itself is truthy)."""
    if value is None or isinstance(value, (bool, int, str)):
        return _as_bool(value)
    kind = type(value).__name__
    if kind == "CPUOffloadPolicy":
        return True
    if kind == "OffloadPolicy":
        return False
    if hasattr(value, "offload_params"):  # FSDP1's CPUOffload
        return bool(value.offload_params)
    raise ValueError(
        f"cpu_offload={value!r}: expected a bool, torch's CPUOffloadPolicy / OffloadPolicy or "
        f"CPUOffload(offload_params=...)."
    )


# accelerate's names for set_mixed_precision (fp8 keeps bf16 parameters; te/torchao do the rest)
_MIXED_PRECISION_DTYPES = {
    "fp8": torch.bfloat16,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
}
_POLICY_FIELDS = ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs")


@dataclasses.dataclass
class FullyShardedDataParallelPlugin:
    """FSDP2 (`torch.distributed.fsdp.fully_shard`) settings for `Accelerator(fsdp_plugin=...)`.

    - reshard_after_forward: free the gathered parameters after forward (FULL_SHARD-like).
    - auto_wrap_policy: "transformer_based_wrap" (classes in `transformer_cls_names_to_wrap`,
      else the model's `_no_split_modules`), "size_based_wrap" (`min_num_params`), "no_wrap"
      (the root only), or a callable `policy(module) -> bool`.
    - mixed_precision_policy: a torch `MixedPrecisionPolicy`, a dict of its fields (dtype names
      allowed), "fp16" / "bf16" / "fp32" / "fp8" (everything in that dtype, as
      `set_mixed_precision` makes it), or None to derive it from the Accelerator's
      mixed_precision (bf16/fp16: parameters in that dtype, gradients reduced in float32).
    - cpu_offload: keep sharded parameters, gradients and optimizer state on the CPU
      (pinned only where CUDA exists). torch's `CPUOffloadPolicy()` / `OffloadPolicy()` (and
      FSDP1's `CPUOffload(offload_params=...)`) are read as True / False.
    - activation_checkpointing: recompute each wrapped block's activations in backward
      (`activation_checkpointing_offload=True` is refused: activations are not offloaded).
    - ignored_modules: modules, a callable `fn(module) -> bool`, or a regular expression on
      module names: those modules are left unsharded (plain replicated tensors).
    - state_dict_type: "SHARDED_STATE_DICT" (each rank writes its shard through
      torch.distributed.checkpoint) or "FULL_STATE_DICT" (gathered, written once).
    - cpu_ram_efficient_loading: rank 0 holds the weights, other ranks build the model on the
      meta device and receive their shards from rank 0 at prepare.
    """

    fsdp_version: int = 2
    reshard_after_forward: bool | str | None = None
    sharding_strategy: Any = None  # FSDP1: translated
    backward_prefetch: Any = None  # FSDP1: dropped with a notice (FSDP2 prefetches itself)
    forward_prefetch: bool = False
    mixed_precision_policy: Any = None
    auto_wrap_policy: str | Callable[..., bool] | None = None
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None
    cpu_offload: bool = False
    ignored_modules: Iterable[torch.nn.Module] | Callable[..., bool] | str | None = None
    state_dict_type: str | None = None
    activation_checkpointing: bool = False
    activation_checkpointing_offload: bool | None = None
    cpu_ram_efficient_loading: bool = False
    sync_module_states: bool | None = None
    use_orig_params: bool | None = None  # FSDP1: always true under FSDP2
    limit_all_gathers: bool | None = None  # FSDP1: no equivalent needed under FSDP2
    param_init_fn: Callable[..., None] | None = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    notices: list[str] = dataclasses.field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.notices = []
        version = int(self.fsdp_version)
        if version not in (1, 2):
            raise ValueError(f"fsdp_version={self.fsdp_version!r}: accepted values are 1 and 2.")
        if version == 1:
            self._note("fsdp_version=1 runs as FSDP2 (fully_shard); FSDP1 is not built")
            self.fsdp_version = 2
        self._translate_sharding()
        if self.backward_prefetch not in (None, False):
            name = _enum_name(self.backward_prefetch, {1: "BACKWARD_PRE", 2: "BACKWARD_POST"})
            self._note(f"backward_prefetch={name} dropped: FSDP2 prefetches in backward itself")
            self.backward_prefetch = None
        for field, why in (
            ("use_orig_params", "FSDP2 always trains the original parameters"),
            ("limit_all_gathers", "FSDP2 bounds its all-gathers itself"),
            ("sync_module_states", "use cpu_ram_efficient_loading to send rank 0's weights"),
        ):
            if getattr(self, field) is not None:
                self._note(f"{field}={getattr(self, field)!r} dropped: {why}")
                setattr(self, field, None)
        for field in ("param_init_fn", "state_dict_config", "optim_state_dict_config"):
            if getattr(self, field) is not None:
                raise ValueError(
                    f"FullyShardedDataParallelPlugin({field}=...) is not supported by accel's "
                    f"FSDP2 strategy; remove it (state dicts are chosen with state_dict_type)."
                )
        if self.reshard_after_forward is None:
            self.reshard_after_forward = True
        elif isinstance(self.reshard_after_forward, str):
            name = self.reshard_after_forward.upper()
            if name in _SHARDING or name in _REFUSED_SHARDING:
                self.sharding_strategy, self.reshard_after_forward = name, None
                self._translate_sharding()
            else:
                self.reshard_after_forward = _as_bool(self.reshard_after_forward)
        self._check_wrap_policy()
        self.state_dict_type = _state_dict_name(self.state_dict_type)
        self.cpu_offload = _offload_flag(self.cpu_offload)
        for field in ("activation_checkpointing", "cpu_ram_efficient_loading"):
            setattr(self, field, _as_bool(getattr(self, field)))
        self.forward_prefetch = _as_bool(self.forward_prefetch)
        if _as_bool(self.activation_checkpointing_offload):
            raise ValueError(
                "activation_checkpointing_offload=True is not supported by accel's FSDP2 strategy "
                "(activations are recomputed, not offloaded); leave it False."
            )
        if isinstance(self.mixed_precision_policy, str):
            self.set_mixed_precision(self.mixed_precision_policy, override=True)

    def _note(self, text: str) -> None:
        self.notices.append(text)

    def _translate_sharding(self) -> None:
        if self.sharding_strategy is None:
            return
        name = _enum_name(self.sharding_strategy, _SHARDING_BY_NUMBER)
        if name in _REFUSED_SHARDING:
            raise ValueError(f"sharding_strategy={name}: {_REFUSED_SHARDING[name]}.")
        if name not in _SHARDING:
            raise ValueError(
                f"sharding_strategy={self.sharding_strategy!r} is not known; accepted: "
                f"{sorted(_SHARDING)} (translated to reshard_after_forward)."
            )
        self._note(f"sharding_strategy={name} -> reshard_after_forward={_SHARDING[name]}")
        self.reshard_after_forward = _SHARDING[name]
        self.sharding_strategy = None

    def _check_wrap_policy(self) -> None:
        policy = self.auto_wrap_policy
        if isinstance(policy, str):
            policy = policy.strip().lower()
            aliases = {"transformer_auto_wrap_policy": "transformer_based_wrap",
                       "size_based_auto_wrap_policy": "size_based_wrap", "none": "no_wrap"}  # fmt: skip
            policy = aliases.get(policy, policy)
            if policy not in _WRAP_POLICIES:
                raise ValueError(
                    f"auto_wrap_policy={self.auto_wrap_policy!r} is not known; accepted: "
                    f"{list(_WRAP_POLICIES)} or a callable policy(module) -> bool."
                )
            self.auto_wrap_policy = policy
        elif policy is not None and not callable(policy):
            raise TypeError(
                f"auto_wrap_policy must be a name or a callable, not {type(policy).__name__}."
            )
        if isinstance(self.transformer_cls_names_to_wrap, str):
            self.transformer_cls_names_to_wrap = [
                n.strip() for n in self.transformer_cls_names_to_wrap.split(",") if n.strip()
            ]
        if self.auto_wrap_policy == "size_based_wrap" and not self.min_num_params:
            raise ValueError(
                "auto_wrap_policy='size_based_wrap' needs min_num_params (a positive number of "
                "parameters above which a module gets its own shard group)."
            )
        if self.auto_wrap_policy is None:
            self.auto_wrap_policy = (
                "size_based_wrap" if self.min_num_params else "transformer_based_wrap"
            )

    # -- accelerate's setters, on accel's representation ------------------------------------
    def set_state_dict_type(self, state_dict_type: Any = None) -> None:
        """Switch the checkpoint format (typically: train sharded, save the final model full).

        A name, number or torch `StateDictType`; None keeps the current one.
        """
        if state_dict_type is not None:
            self.state_dict_type = _state_dict_name(state_dict_type)

    def set_auto_wrap_policy(self, model: torch.nn.Module) -> None:
        """Resolve the wrap policy against `model`, as accelerate does before wrapping.

        transformer_based_wrap: the classes to wrap default to `model._no_split_modules`, and
        each named class must exist in the model. size_based_wrap with min_num_params of 0
        wraps nothing. The policy stays a name (accel's FSDP2 strategy applies it); a callable
        policy is left as it is.
        """
        if self.auto_wrap_policy == "transformer_based_wrap":
            names = self.transformer_cls_names_to_wrap
            if names is None:
                names = list(getattr(model, "_no_split_modules", None) or [])
            found = {type(m).__name__ for m in model.modules()}
            for name in names:
                if name not in found:
                    raise ValueError(
                        f"Could not find the transformer layer class {name} in the model; its "
                        f"module classes are {sorted(found)}."
                    )
            self.transformer_cls_names_to_wrap = list(names)
        elif self.auto_wrap_policy == "size_based_wrap" and not (self.min_num_params or 0) > 0:
            self.auto_wrap_policy = "no_wrap"

    def set_mixed_precision(
        self,
        mixed_precision: str | torch.dtype,
        buffer_autocast: bool = False,
        override: bool = False,
    ) -> None:
        """Set the FSDP2 `MixedPrecisionPolicy` from "fp8" / "fp16" / "bf16" / "fp32" or a dtype:
        parameters, gradient reduction and outputs in that dtype. Only where no policy is set,
        unless `override`; a dict policy is converted instead. (`buffer_autocast` is FSDP1's:
        FSDP2 leaves buffers alone.)"""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dtype = mixed_precision
        if isinstance(mixed_precision, str):
            dtype = _MIXED_PRECISION_DTYPES.get(mixed_precision)
        if dtype not in _MIXED_PRECISION_DTYPES.values():
            raise ValueError(
                f"Invalid mixed precision: {mixed_precision!r}. Must be one of "
                f"{list(_MIXED_PRECISION_DTYPES)} or one of their torch dtypes."
            )
        policy = self.mixed_precision_policy
        if override or policy is None or isinstance(policy, str):
            self.mixed_precision_policy = MixedPrecisionPolicy(
                param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype
            )
        elif isinstance(policy, dict):
            self.validate_mixed_precision_policy()
            self.mixed_precision_policy = MixedPrecisionPolicy(
                **{k: _policy_value(k, v) for k, v in policy.items()}
            )

    def validate_mixed_precision_policy(self) -> None:
        """Raise unless the policy is a `MixedPrecisionPolicy` or a dict of its fields."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = self.mixed_precision_policy
        if isinstance(policy, MixedPrecisionPolicy):
            return
        if isinstance(policy, dict) and set(policy) <= set(_POLICY_FIELDS):
            for key, value in policy.items():
                _policy_value(key, value)
            return
        raise ValueError(
            f"mixed_precision_policy must be an instance of "
            f"`torch.distributed.fsdp.MixedPrecisionPolicy` or a dict of its fields "
            f"{list(_POLICY_FIELDS)}; got {policy!r}."
        )

    def set_cpu_offload(self) -> None:
        """Normalize `cpu_offload` (a bool, or torch's offload policy objects) to a bool."""
        self.cpu_offload = _offload_flag(self.cpu_offload)

    def validate_cpu_offload(self) -> None:
        """Raise unless `cpu_offload` is a bool or one of torch's offload policy objects."""
        _offload_flag(self.cpu_offload)

    def warn_notices(self) -> None:
        """Emit the translation notices once (on the process that calls this)."""
        for text in self.notices:
            warnings.warn(f"FSDP: {text}.", stacklevel=3)
        self.notices = []

    @classmethod
    def from_launch_config(cls, section: Mapping[str, Any]) -> FullyShardedDataParallelPlugin:
        """The plugin from an `fsdp_config` section (accelerate's YAML keys, `fsdp_` prefix)."""
        keys = {
            "fsdp_version": "fsdp_version",
            "fsdp_reshard_after_forward": "reshard_after_forward",
            "fsdp_sharding_strategy": "sharding_strategy",
            "fsdp_backward_prefetch": "backward_prefetch",
            "fsdp_backward_prefetch_policy": "backward_prefetch",
            "fsdp_forward_prefetch": "forward_prefetch",
            "fsdp_auto_wrap_policy": "auto_wrap_policy",
            "fsdp_transformer_layer_cls_to_wrap": "transformer_cls_names_to_wrap",
            "fsdp_min_num_params": "min_num_params",
            "fsdp_offload_params": "cpu_offload",
            "fsdp_state_dict_type": "state_dict_type",
            "fsdp_activation_checkpointing": "activation_checkpointing",
            "fsdp_cpu_ram_efficient_loading": "cpu_ram_efficient_loading",
            "fsdp_sync_module_states": "sync_module_states",
            "fsdp_use_orig_params": "use_orig_params",
            "fsdp_ignored_modules": "ignored_modules",
            "fsdp_activation_checkpointing_offload": None,
        }
        kwargs: dict[str, Any] = {}
        for key, value in section.items():
            if key not in keys:
                raise ValueError(
                    f"fsdp_config key {key!r} is not known to accel's FSDP2 strategy; known: "
                    f"{sorted(keys)}."
                )
            if keys[key] is None:
                if _as_bool(value):
                    raise ValueError(
                        f"fsdp_config {key}: {value!r} is not supported by accel's FSDP2 "
                        f"strategy (activations are recomputed, not offloaded); set it to false."
                    )
                continue
            if value is not None:
                kwargs[keys[key]] = value
        if "min_num_params" in kwargs:
            kwargs["min_num_params"] = int(kwargs["min_num_params"])
        if str(kwargs.get("auto_wrap_policy", "")).upper() == "NO_WRAP":
            kwargs["auto_wrap_policy"] = "no_wrap"
        return cls(**kwargs)


def _policy_value(key: str, value: Any) -> Any:
    """One field of a dict mixed precision policy: dtypes by object or name."""
    if key not in _POLICY_FIELDS:
        raise ValueError(
            f"mixed_precision_policy key {key!r} is not a MixedPrecisionPolicy field; accepted: "
            f"{list(_POLICY_FIELDS)}."
        )
    if key == "cast_forward_inputs" or value is None or isinstance(value, torch.dtype):
        return value
    dtype = _MIXED_PRECISION_DTYPES.get(str(value)) or getattr(
        torch, str(value).replace("torch.", ""), None
    )
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"mixed_precision_policy {key}={value!r} is not a torch dtype.")
    return dtype
