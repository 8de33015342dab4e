"""FSDP2: parameters sharded over the processes with `torch.distributed.fsdp.fully_shard`.

Each wrapped block (chosen by the plugin's auto-wrap policy) and the root become FSDP modules
whose parameters are DTensors sharded on dim 0. Sharding replaces the parameters, so the
optimizers of the same `prepare` call are re-pointed at the new ones. Checkpoints go through
`torch.distributed.checkpoint`: sharded (each process writes its shard; loads on any number
of processes) or full (gathered, written once).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_parallel._checkpoint_files import (
    fsdp_model_file,
    fsdp_model_folder,
    fsdp_optimizer_folder,
)
from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin
from accel_parallel._io import WRITE_THREADS, add_job, fsync_enabled, save_object, staging
from accel_parallel._registry import StrategyRequest, register_strategy
from accel_parallel._strategy import ProcessInfo, Strategy

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _dtype(value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    name = str(value).replace("torch.", "")
    dtype = getattr(torch, name, None) or _DTYPES.get(name)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"mixed_precision_policy dtype {value!r} is not a torch dtype name.")
    return dtype


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class FSDP2Strategy(Strategy):
    """`fully_shard` over all processes (a 1-D mesh); see the module docstring."""

    name = "fsdp"
    supports_no_sync = True
    sharded = True  # fp16 needs a ShardedGradScaler
    reshardable = True  # sharded checkpoints load on another number of processes

    def __init__(
        self,
        info: ProcessInfo,
        plugin: FullyShardedDataParallelPlugin | None = None,
        mixed_precision: str = "no",
        *,
        clip_norm: float | None = None,
    ) -> None:
        super().__init__(info, clip_norm=clip_norm)
        self.plugin = plugin or FullyShardedDataParallelPlugin()
        self.mixed_precision = mixed_precision
        self._mesh: Any = None
        self._optimizer_models: dict[int, nn.Module] = {}
        self._checkpoint_groups: dict[str, Any] = {}
        self._checkpoint_stagers: dict[str, Any] = {}

    @property
    def fsdp_plugin(self) -> FullyShardedDataParallelPlugin:
        return self.plugin

    def distributed_type(self, topology: Any) -> Any:
        from accel_state import DistributedType

        return DistributedType.FSDP

    # -- preparing -----------------------------------------------------------------------
    def _device_mesh(self) -> Any:
        if self._mesh is None:
            import torch.distributed as dist
            from torch.distributed.device_mesh import init_device_mesh

            if not dist.is_initialized():  # one process: a group of one, so DCP and FSDP work
                backend = "nccl" if self.device.type == "cuda" else "gloo"
                dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            self._mesh = init_device_mesh(self.device.type, (dist.get_world_size(),))
        return self._mesh

    def _mp_policy(self) -> Any:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = self.plugin.mixed_precision_policy
        if isinstance(policy, MixedPrecisionPolicy):
            return policy
        if isinstance(policy, dict):
            fields = {k: _dtype(v) if k.endswith("dtype") else v for k, v in policy.items()}
            return MixedPrecisionPolicy(**fields)
        if policy is not None:
            raise TypeError(
                f"mixed_precision_policy must be a MixedPrecisionPolicy, a dict or None, not "
                f"{type(policy).__name__}."
            )
        dtype = _DTYPES.get(self.mixed_precision)
        if dtype is None:
            return MixedPrecisionPolicy()
        # Parameters gathered in the low precision; gradients reduced in float32.
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)

    def _offload_policy(self) -> Any:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

        if not self.plugin.cpu_offload:
            return OffloadPolicy()
        return CPUOffloadPolicy(pin_memory=torch.cuda.is_available())

    def _blocks(self, model: nn.Module) -> list[nn.Module]:
        """The submodules that get their own shard group, in post-order (children first)."""
        policy = self.plugin.auto_wrap_policy
        if policy == "no_wrap":
            return []
        if policy == "transformer_based_wrap":
            names = self.plugin.transformer_cls_names_to_wrap or list(
                getattr(model, "_no_split_modules", None) or []
            )
            if not names:
                return []
            found = {type(m).__name__ for m in model.modules()}
            missing = [n for n in names if n not in found]
            if missing and self.plugin.transformer_cls_names_to_wrap:
                raise ValueError(
                    f"transformer_cls_names_to_wrap names {missing}, which the model does not "
                    f"contain; its module classes are {sorted(found)}."
                )
            return [m for m in model.modules() if m is not model and type(m).__name__ in names]
        if policy == "size_based_wrap":
            return self._size_blocks(model, int(self.plugin.min_num_params or 0))
        return [m for m in model.modules() if m is not model and _call_policy(policy, m)]

    @staticmethod
    def _size_blocks(model: nn.Module, minimum: int) -> list[nn.Module]:
        chosen: list[nn.Module] = []

        def visit(module: nn.Module) -> int:
            """Parameters of `module` not yet in a chosen block."""
            left = sum(p.numel() for p in module.parameters(recurse=False))
            for child in module.children():
                left += visit(child)
            if module is not model and left >= minimum:
                chosen.append(module)
                return 0
            return left

        visit(model)
        return chosen

    def _ignored(self, model: nn.Module) -> set[nn.Parameter]:
        spec = self.plugin.ignored_modules
        if spec is None:
            return set()
        if isinstance(spec, str):
            pattern = re.compile(spec)
            mods = [m for n, m in model.named_modules() if n and pattern.search(n)]
        elif callable(spec):
            mods = [m for m in model.modules() if spec(m)]
        else:
            mods = list(spec)
        return {p for m in mods for p in m.parameters()}

    def prepare(
        self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        if self.info.process_index == 0:
            self.plugin.warn_notices()
        for opt in optimizers:
            if opt.state:
                raise ValueError(
                    "FSDP2 shards the parameters, and this optimizer already holds state for the "
                    "unsharded ones (it stepped before prepare). Create the optimizer fresh, or "
                    "load its state after prepare."
                )
        # Where each parameter lives (module, attribute), so optimizers can be re-pointed at
        # the sharded parameters that replace them.
        owners: dict[int, tuple[nn.Module, str]] = {}
        for model in models:
            for module in model.modules():
                for attr, p in module._parameters.items():
                    if p is not None:
                        owners.setdefault(id(p), (module, attr))
        sharded = [self.wrap_model(m) for m in models]
        for opt in optimizers:
            for group in opt.param_groups:
                new = []
                for p in group["params"]:
                    owner = owners.get(id(p))
                    new.append(owner[0]._parameters[owner[1]] if owner else p)
                group["params"] = new
            ids = {id(p) for g in opt.param_groups for p in g["params"]}
            for model in sharded:
                if any(id(p) in ids for p in model.parameters()):
                    self._optimizer_models[id(opt)] = model
        return sharded, optimizers

    def wrap_model(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if isinstance(model, FSDPModule):
            return model
        mesh = self._device_mesh()
        efficient = self.plugin.cpu_ram_efficient_loading
        full_state = None
        if efficient:
            full_state = model.state_dict() if self.info.process_index == 0 else None
        elif any(p.device.type == "meta" for p in model.parameters()):
            raise ValueError(
                "The model has parameters on the meta device; load its weights before prepare(), "
                "or use FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True) with "
                "the weights on rank 0."
            )
        if not efficient:
            model = model.to(self.device)
        blocks = self._blocks(model)
        if self.plugin.activation_checkpointing:
            _checkpoint_blocks(model, blocks)
        kwargs = {
            "mesh": mesh,
            "reshard_after_forward": self.plugin.reshard_after_forward,
            "mp_policy": self._mp_policy(),
            "offload_policy": self._offload_policy(),
        }
        ignored = self._ignored(model)
        if ignored:
            kwargs["ignored_params"] = ignored
        for block in blocks:
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        if self.plugin.forward_prefetch:
            for block, following in itertools.pairwise(blocks):
                block.set_modules_to_forward_prefetch([following])
        if efficient:
            self._broadcast_from_rank0(model, full_state)
        return model

    def _broadcast_from_rank0(self, model: nn.Module, full_state: dict | None) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if any(t.device.type == "meta" for t in model.state_dict().values()):
            device = "cpu" if self.plugin.cpu_offload else self.device
            model.to_empty(device=device)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, full_state or {}, options=options)

    # -- the step --------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Accumulate unsharded gradients locally: no reduce-scatter until the block ends."""
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    @contextlib.contextmanager
    def sync_in_backward(self, model: nn.Module) -> Iterator[None]:
        model.set_requires_gradient_sync(True)
        yield

    def clip_grad_norm_(
        self, parameters: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip by the global norm over every shard; returns that norm (a plain tensor).

        The gradients are DTensors (on one mesh, or on several under a ParallelismConfig: tp,
        the data-parallel one, both) and plain tensors of ignored, replicated modules: each
        group of one mesh and placement has its norm taken apart, then they are combined."""
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return torch.tensor(0.0)
        groups: dict[Any, list[torch.Tensor]] = {}
        for g in grads:
            key = (g.device_mesh, tuple(g.placements)) if hasattr(g, "device_mesh") else None
            groups.setdefault(key, []).append(g)
        norms = []
        for group in groups.values():
            norm = nn.utils.get_total_norm(group, norm_type)
            norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        device = norms[0].device
        total = torch.linalg.vector_norm(
            torch.stack([n.to(device, torch.float32) for n in norms]), norm_type
        )
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            local = _local(g)
            local.mul_(coef.to(local.device, local.dtype))
        return total

    def clip_grad_value_(self, parameters: Iterable[nn.Parameter], clip_value: float) -> None:
        for p in parameters:
            if p.grad is not None:
                _local(p.grad).clamp_(-clip_value, clip_value)

    # -- state -------------------------------------------------------------------------------
    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict on the main process (CPU tensors); other processes get {}."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)
        # Gathering copies each name apart: tied weights become one tensor again, so that
        # exports write them once (as for an unsharded model).
        names: dict[int, list[str]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(name)
        for group in names.values():
            present = [n for n in group if n in state]
            for other in present[1:]:
                state[other] = state[present[0]]
        return state

    def load_model_state_dict(
        self, model: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True
    ) -> Any:
        """Load a full state dict (given on every process, or on rank 0 only: then broadcast)."""
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        everywhere = torch.tensor([1 if state_dict else 0], device=device)
        dist.all_reduce(everywhere, op=dist.ReduceOp.MIN)
        options = StateDictOptions(
            full_state_dict=True, strict=strict, broadcast_from_rank0=not bool(everywhere.item())
        )
        return set_model_state_dict(model, state_dict, options=options)

    def _model_for(self, optimizer: torch.optim.Optimizer, model: nn.Module | None) -> nn.Module:
        model = model or self._optimizer_models.get(id(optimizer))
        if model is None:
            raise ValueError(
                "This optimizer was not prepared together with an FSDP2 model: pass the model "
                "and its optimizer to the same prepare() call."
            )
        return model

    def optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, model: nn.Module | None = None
    ) -> dict[str, Any]:
        """The full optimizer state keyed by parameter names, on the main process."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(
            self._model_for(optimizer, model), optimizer, options=options
        )

    def load_optimizer_state_dict(
        self,
        optimizer: torch.optim.Optimizer,
        state_dict: dict[str, Any],
        model: nn.Module | None = None,
    ) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(
            self._model_for(optimizer, model), optimizer, state_dict, options=options
        )

    def gradients_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """This process's shard of the accumulated gradients (restored on the same layout)."""
        return {
            n: _local(p.grad).detach().cpu()
            for n, p in model.named_parameters()
            if p.grad is not None
        }

    def load_gradients_state(self, model: nn.Module, grads: dict[str, torch.Tensor]) -> None:
        from torch.distributed.tensor import DTensor

        for name, param in model.named_parameters():
            if name not in grads:
                param.grad = None
                continue
            local = grads[name].to(_local(param).device)
            if local.shape != _local(param).shape:
                raise ValueError(
                    f"the checkpoint's accumulated gradient of {name} has the shard shape "
                    f"{tuple(local.shape)}, this process holds {tuple(_local(param).shape)}: a "
                    f"checkpoint saved in the middle of gradient accumulation resumes only on "
                    f"the same number of processes. Save at an accumulation boundary to reshard."
                )
            if isinstance(param, DTensor):
                local = DTensor.from_local(local, param.device_mesh, param.placements,
                                           shape=param.shape, stride=param.stride())  # fmt: skip
            param.grad = local

    # -- files ---------------------------------------------------------------------------------
    def _dcp_save(self, state: dict[str, Any], folder: Path) -> None:
        """dcp.save, or, for an asynchronous checkpoint, dcp.async_save (the state is staged in
        CPU memory now, written in the background on a gloo group of its own, so that its
        collectives never interleave with the training's or another piece's).

        Each process writes its shard as WRITE_THREADS files from as many threads, fsynced
        unless the save runs inside `deferred_fsync(enabled=False)`. An asynchronous save
        stages into the CPU buffers the previous one used (kept per folder name): a memory
        copy, without faulting in fresh pages each time."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        writer = dcp.FileSystemWriter(
            folder, thread_count=WRITE_THREADS, sync_files=fsync_enabled()
        )
        if not staging():
            dcp.save(state, storage_writer=writer)
            return
        # One group per piece (model, optimizer, ...): their background saves run at the same
        # time, and collectives of one group never interleave with another's.
        group = self._checkpoint_groups.get(folder.name)
        if group is None:
            group = self._checkpoint_groups[folder.name] = dist.new_group(backend="gloo")
        stager = self._checkpoint_stagers.get(folder.name)
        if stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            options = StagingOptions(
                use_pinned_memory=torch.cuda.is_available(),
                use_shared_memory=False,
                use_async_staging=False,
                use_non_blocking_copy=False,
            )
            stager = self._checkpoint_stagers[folder.name] = DefaultStager(options)
        future = dcp.async_save(
            state, storage_writer=writer, process_group=group, async_stager=stager
        )
        add_job(future.result)

    def _sharded(self) -> bool:
        return self.plugin.state_dict_type == "SHARDED_STATE_DICT"

    # Files in accelerate's layout (see accel_parallel._checkpoint_files): sharded, one DCP
    # folder per object (pytorch_model_fsdp_<i>, optimizer_<i>); full, torch files written by
    # the main process (pytorch_model_fsdp.bin, optimizer.bin).
    def save_model_files(
        self,
        model: nn.Module,
        directory: Path,
        name: str,
        *,
        writer: bool,
        write_full: Callable[[dict[str, torch.Tensor], Path], None],
    ) -> None:
        if not self._sharded():
            state = self.model_state_dict(model)
            if writer:
                save_object(state, directory / fsdp_model_file(name))
            return
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        self._dcp_save({"model": get_model_state_dict(model)}, directory / fsdp_model_folder(name))

    def load_model_files(
        self,
        model: nn.Module,
        directory: Path,
        name: str,
        *,
        read_full: Callable[[Path], dict[str, torch.Tensor]],
        strict: bool = True,
    ) -> None:
        folder = directory / fsdp_model_folder(name)
        if not folder.is_dir():
            full = directory / fsdp_model_file(name)
            if not full.is_file():
                raise FileNotFoundError(
                    f"the checkpoint in {directory} has neither the sharded model folder "
                    f"{folder.name} nor the full model file {full.name} (FSDP2 writes one of "
                    f"them, by the plugin's state_dict_type)."
                )
            import torch.distributed as dist

            state = _load_tensors(full) if dist.get_rank() == 0 else {}
            self.load_model_state_dict(model, state, strict=strict)
            return
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            set_model_state_dict,
        )

        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=folder)
        set_model_state_dict(model, state["model"], options=StateDictOptions(strict=strict))

    def save_optimizer_files(
        self,
        optimizer: torch.optim.Optimizer,
        directory: Path,
        name: str,
        *,
        writer: bool,
        model: nn.Module | None = None,
    ) -> None:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        model = self._model_for(optimizer, model)
        if not self._sharded():
            super().save_optimizer_files(optimizer, directory, name, writer=writer, model=model)
            return
        state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
        self._dcp_save(state, directory / fsdp_optimizer_folder(name))

    def load_optimizer_files(
        self,
        optimizer: torch.optim.Optimizer,
        directory: Path,
        name: str,
        model: nn.Module | None = None,
    ) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        model = self._model_for(optimizer, model)
        folder = directory / fsdp_optimizer_folder(name)
        if not folder.is_dir():
            super().load_optimizer_files(optimizer, directory, name, model=model)
            return
        state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
        dcp.load(state, checkpoint_id=folder)
        set_optimizer_state_dict(model, optimizer, state["optimizer"])


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


def _call_policy(policy: Callable[..., bool], module: nn.Module) -> bool:
    """A callable policy: `fn(module)`, or FSDP1's `fn(module, recurse, nonwrapped_numel)`."""
    params = inspect.signature(policy).parameters
    if len(params) >= 3:
        numel = sum(p.numel() for p in module.parameters())
        return bool(policy(module=module, recurse=False, nonwrapped_numel=numel))
    return bool(policy(module))


def _checkpoint_blocks(model: nn.Module, blocks: list[nn.Module]) -> None:
    """Recompute the activations of each block in backward (torch's checkpoint, non-reentrant).

    The blocks keep their identity and parameter names: their forward runs under checkpoint.
    """
    from torch.utils.checkpoint import checkpoint

    targets = blocks or [model]
    for block in targets:
        forward = block.forward

        def run(*args: Any, _forward: Callable[..., Any] = forward, **kwargs: Any) -> Any:
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = run


def plugin_for(request: StrategyRequest) -> FullyShardedDataParallelPlugin:
    """The request's FSDP plugin, else one from the `accel launch` fsdp_config section."""
    if request.fsdp_plugin is not None:
        return request.fsdp_plugin
    return FullyShardedDataParallelPlugin.from_launch_config(request.launch_section("fsdp_config"))


def _build(request: StrategyRequest) -> FSDP2Strategy:
    return FSDP2Strategy(
        request.info,
        plugin_for(request),
        mixed_precision=request.mixed_precision,
        clip_norm=request.clip_norm,
    )


def _claims(request: StrategyRequest) -> int | None:
    if request.fsdp_plugin is not None:
        return 40
    return 20 if request.launched_type == "FSDP" else None


register_strategy(FSDP2Strategy.name, _build, claims=_claims)
