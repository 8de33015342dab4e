"""One training step of the real model under fake tensors, with torch's memory trackers.

The model is built (or copied) under `FakeTensorMode`, so parameters, activations and
optimizer states have sizes but no storage; FSDP2 is applied as accel's FSDP2 strategy applies
it, over a fake process group of the requested world size in this one process. Two steps
run (the first creates the optimizer states); the peak of both, per category, is what
`MemTracker` (plain model) or `FSDPMemTracker` (FSDP2) saw.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

ModelSource = nn.Module | Callable[[], nn.Module]
BatchFn = Callable[[nn.Module], Any]

CATEGORIES = (
    "weights",
    "gradients",
    "optimizer_states",
    "activations",
    "temporaries",
    "communication",
)

# torch's tracker categories (the enum values) -> ours
CATEGORY_OF = {
    "Parameter": "weights",
    "Sharded Param": "weights",
    "Unsharded Param": "weights",
    "Buffer": "weights",
    "Gradient": "gradients",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients",
    "Optstate": "optimizer_states",
    "OptState": "optimizer_states",
    "Activation": "activations",
    "Inputs": "activations",
    "Other": "activations",  # the batch, tracked as external
    "Temp": "temporaries",
    "All Gather": "communication",
    "Reduce Scatter": "communication",
}

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW,
    "adam": torch.optim.Adam,
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-3, momentum=0.9),
    "adagrad": torch.optim.Adagrad,
    "rmsprop": torch.optim.RMSprop,
}
AUTOCAST = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class TraceError(RuntimeError):
    """The step could not run under fake tensors; `module` is where it stopped."""

    def __init__(self, module: str, cause: BaseException) -> None:
        super().__init__(f"{module}: {type(cause).__name__}: {cause}")
        self.module = module
        self.cause = cause


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What the engine rules need from a model (before any cast): bytes of all parameters and
    of those that train, the largest FSDP unit's parameter bytes, and the element counts."""

    param_bytes: int
    trained_bytes: int
    largest_unit_bytes: int
    numel: int
    trained_numel: int = 0


def optimizer_factory(name: str) -> Callable[..., torch.optim.Optimizer]:
    try:
        return OPTIMIZERS[name.lower()]
    except KeyError:
        raise ValueError(
            f"optimizer={name!r}: expected one of {sorted(OPTIMIZERS)}; pass another by "
            "building the estimate from code with a factory that returns it."
        ) from None


def check_precision(mixed_precision: str) -> None:
    if mixed_precision not in AUTOCAST:
        raise ValueError(
            f"mixed_precision={mixed_precision!r}: expected one of {sorted(AUTOCAST)}; fp8 is "
            "not estimated (bf16 gives an upper bound for it)."
        )


def template(source: ModelSource) -> nn.Module:
    """The model to copy: a factory's, built on the meta device (nothing allocated), or the
    module given."""
    if isinstance(source, nn.Module):
        return source
    with torch.device("meta"):
        model = source()
    if not isinstance(model, nn.Module):
        raise TypeError(f"the model factory returned {type(model).__name__}, not an nn.Module.")
    return model


def fake_model(model: nn.Module, mode: Any, dtype: torch.dtype | None = None) -> nn.Module:
    """A copy of `model` whose parameters and buffers are fake CPU tensors of the same shapes
    (floating ones cast to `dtype` when given); nothing is allocated."""
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        kind = dtype if dtype is not None and t.is_floating_point() else t.dtype
        with mode:
            fake = torch.empty(t.shape, dtype=kind, device="cpu")
        memo[id(t)] = nn.Parameter(fake, t.requires_grad) if isinstance(t, nn.Parameter) else fake
    with mode:
        return copy.deepcopy(model, memo)


def faked(batch: Any, mode: Any) -> Any:
    """`batch` with each real tensor replaced by a fake one of its shape (nothing copied)."""
    from torch._subclasses.fake_tensor import FakeTensor

    def fake(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor):
            return mode.from_tensor(t, static_shapes=True)
        return t

    return torch.utils._pytree.tree_map(fake, batch)


def default_batch(model: nn.Module, batch_size: int, seq_len: int | None) -> dict[str, Any]:
    """An example batch from the model's first input layer: token ids (with labels, so a
    transformers model computes its loss) for a model with `config.vocab_size` or an
    embedding first; random features for a model that starts with a Linear."""
    cfg = getattr(model, "config", None)
    first = next((m for m in model.modules() if isinstance(m, nn.Embedding | nn.Linear)), None)
    vocab = getattr(cfg, "vocab_size", None) or (
        first.num_embeddings if isinstance(first, nn.Embedding) else None
    )
    if vocab:
        ids = torch.randint(0, int(vocab), (batch_size, seq_len or 1))
        return {"input_ids": ids, "labels": ids} if cfg is not None else {"args": (ids,)}
    if isinstance(first, nn.Linear):
        shape = (
            (batch_size, seq_len, first.in_features) if seq_len else (batch_size, first.in_features)
        )
        return {"args": (torch.randn(shape),)}
    raise ValueError(
        f"{type(model).__name__}: no example batch can be made (no config.vocab_size, no "
        "Embedding or Linear input layer); pass batch=callable(model) -> batch."
    )


def loss_of(output: Any) -> torch.Tensor:
    """The loss a step backpropagates: `output.loss` (transformers), else the output's mean
    (its first tensor's, for a tuple)."""
    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    if isinstance(output, tuple | list):
        output = output[0]
    if isinstance(output, Mapping):
        output = next(iter(output.values()))
    return output.float().mean()


def call_model(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, Mapping):
        args = batch.get("args", ())
        kwargs = {k: v for k, v in batch.items() if k != "args"}
        return model(*args, **kwargs)
    if isinstance(batch, tuple | list):
        return model(*batch)
    return model(batch)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    mixed_precision: str,
    loss_fn: Callable[[Any], torch.Tensor] = loss_of,
) -> None:
    """Forward and `loss_fn` (under autocast for bf16/fp16), backward, optimizer step,
    zero_grad. A loss that is not a scalar (a pipeline stage's output) is backpropagated from
    a gradient of its shape, as the next stage sends one."""
    dtype = AUTOCAST[mixed_precision]
    ctx = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
    with ctx:
        loss = loss_fn(call_model(model, batch))
    loss.backward(None if loss.dim() == 0 else torch.empty_like(loss))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[None]:
    """A fake default process group of `world_size` (rank 0) for the duration; refused when a
    real one is already set up (the estimate then runs in a fresh process)."""
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg as fake_pg  # registers "fake"

    try:
        from torch._C._distributed_c10d import FakeStore
    except ImportError:  # torch 2.9 has it in Python, beside the fake backend
        FakeStore = fake_pg.FakeStore
    if importlib.util.find_spec("torch.distributed._meta_registrations") is None:
        # torch 2.9 registers no Meta kernels for c10d's collectives (later torch does at
        # import), so tensor parallel's scatter of a fake weight fails: torch's memory tools
        # register the same ones
        import torch.distributed._tools.fake_collectives  # noqa: F401

    if dist.is_initialized():
        raise RuntimeError(
            "a process group is already initialized in this process; FSDP2 is traced over a "
            "fake one, so estimate before init_process_group or in a separate process."
        )
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _where(model: nn.Module) -> Iterator[list[str]]:
    """The names of the modules whose forward is running (innermost last)."""
    stack: list[str] = []
    names = {id(m): n or type(m).__name__ for n, m in model.named_modules()}

    def enter(module: nn.Module, args: Any) -> None:
        stack.append(names.get(id(module), type(module).__name__))

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        if stack:
            stack.pop()

    handles = [
        nn.modules.module.register_module_forward_pre_hook(enter),
        nn.modules.module.register_module_forward_hook(leave),
    ]
    try:
        yield stack
    finally:
        for h in handles:
            h.remove()


def raw_peak(snapshot: Mapping[Any, Mapping[Any, int]]) -> dict[str, int]:
    """The tracker's peak snapshot summed over devices, by torch's category names."""
    out: dict[str, int] = {}
    for per_device in snapshot.values():
        for key, nbytes in per_device.items():
            name = getattr(key, "value", key)
            if name != "Total":
                out[name] = out.get(name, 0) + int(nbytes)
    return out


@dataclasses.dataclass(frozen=True)
class Traced:
    """A traced step by torch's category names: at its peak, and at every moment the tracker
    recorded (each module's entry, exit and peak in forward and backward, and the peak), where
    an engine rule that moves categories off the device may find its own peak."""

    peak: dict[str, int]
    moments: list[dict[str, int]]
    collective_bytes: int = 0  # what the functional collectives (tensor parallel's) moved
    forward_saved: int = 0  # what the model's forward left allocated (saved for backward)


class _CollectiveBytes(TorchDispatchMode):
    """Counts the bytes the functional collectives of one step move per rank: tensor
    parallel's all-reduces (twice their tensor, as a ring sends it), all-gathers (their
    output) and reduce-scatters (their input). FSDP2's own collectives are not functional
    ones, so they are not counted here."""

    _FACTOR = {"all_reduce": 2, "all_reduce_": 2, "all_gather_into_tensor": 1,
               "reduce_scatter_tensor": 1, "all_to_all_single": 1}  # fmt: skip

    def __init__(self) -> None:
        super().__init__()
        self.nbytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace == "_c10d_functional" and func._opname in self._FACTOR:
            tensor = args[0]
            factor = int(args[1]) if func._opname == "all_gather_into_tensor" else 1
            factor *= self._FACTOR[func._opname]
            self.nbytes += factor * tensor.numel() * tensor.element_size()
        return func(*args, **(kwargs or {}))


class _ActiveOnly:
    """A tracker whose per-operation peak update visits only the modules running now.

    torch's trackers look at every module tracked so far, through a weak dictionary, after
    each operation, to update the peaks of those running: O(operations x modules), most of a
    32-layer model's trace. The update is torch's own, given only the tracked modules whose
    name is among the running ones (the others it would skip), so the peaks are the same.
    """

    _by_name: dict[str, list[tuple[Any, Any]]] | None = None

    def reset_mod_stats(self) -> None:
        super().reset_mod_stats()  # type: ignore[misc]
        self._by_name = None

    def _update_peak_stats(self, peak_state: Any) -> None:
        tracking = self.memory_tracking  # type: ignore[attr-defined]
        if self._by_name is None or self._count != len(tracking):
            self._by_name, self._count = {}, len(tracking)
            for module, stats in tracking.items():
                self._by_name.setdefault(stats.mod_fqn, []).append((module, stats))
        running = self._mod_tracker.parents  # type: ignore[attr-defined]
        self.memory_tracking = {m: s for name in running for m, s in self._by_name.get(name, ())}
        try:
            super()._update_peak_stats(peak_state)  # type: ignore[misc]
        finally:
            self.memory_tracking = tracking


def _tracker(kind: str) -> type:
    """torch's FSDPMemTracker ("fsdp") or MemTracker, with `_ActiveOnly`'s peak update."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    base = FSDPMemTracker if kind == "fsdp" else MemTracker
    return type(f"ActiveOnly{base.__name__}", (_ActiveOnly, base), {})


def run_traced(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    mixed_precision: str,
    fsdp: bool,
    loss_fn: Callable[[Any], torch.Tensor] = loss_of,
) -> Traced:
    """Two steps under the tracker (the first makes the optimizer states); what the second
    recorded (`train_step`, with `loss_fn`). A failure names the module."""
    tensors = [t for t in torch.utils._pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)]
    if fsdp:
        tracker: Any = _tracker("fsdp")(model, optimizer)
        tracker.track_inputs(tuple(tensors))
    else:
        tracker = _tracker("plain")()
        tracker.track_external(model, optimizer, *tensors)
    collectives = _CollectiveBytes()
    with _where(model) as stack:
        try:
            for i in range(2):
                if i:
                    tracker.reset_mod_stats()
                    collectives.nbytes = 0
                with tracker, collectives:
                    train_step(model, optimizer, batch, mixed_precision, loss_fn)
        except Exception as exc:
            where = stack[-1] if stack else "(optimizer step or loss)"
            raise TraceError(where, exc) from exc
    peak = raw_peak(tracker.get_tracker_snapshot("peak"))
    moments = [
        raw_peak(snapshot)
        for stats in tracker.memory_tracking.values()
        for snapshots in stats.snapshots.values()
        for snapshot in snapshots
    ]
    saved = 0
    root = tracker.memory_tracking.get(model)
    if root is not None:
        from torch.distributed._tools.mem_tracker import _ModState

        before, after = (
            root.snapshots.get(state) for state in (_ModState.PRE_FW, _ModState.POST_FW)
        )
        if before and after:
            saved = sum(raw_peak(after[-1]).values()) - sum(raw_peak(before[-1]).values())
    return Traced(peak, [peak, *moments], collectives.nbytes, saved)


def sizes_of(model: nn.Module, units: list[nn.Module]) -> Sizes:
    def nbytes(params: Any) -> int:
        return sum(p.numel() * p.element_size() for p in params)

    params = list(model.parameters())
    unit_bytes = [nbytes(u.parameters()) for u in units] or [nbytes(params)]
    return Sizes(
        param_bytes=nbytes(params),
        trained_bytes=nbytes(p for p in params if p.requires_grad),
        largest_unit_bytes=max(unit_bytes),
        numel=sum(p.numel() for p in params),
        trained_numel=sum(p.numel() for p in params if p.requires_grad),
    )
