"""Training memory per engine, estimated without materializing the model.

`estimate_training_memory` runs one real forward, backward and optimizer step of the model
(twice, so the optimizer states exist) under fake tensors: FSDP2 is applied as accel's FSDP2
strategy applies it, over a fake process group of the world size, and torch's memory
trackers (`torch.distributed._tools`) report the peak per device, broken down into weights,
gradients, optimizer states, activations (with the batch), temporaries and communication
buffers; the parts add up to the peak. DDP and ZeRO-1/2/3 are derived from the traced step by
their engines' rules (see `_memory_engines`; each row's `method` says which). A step that
cannot run under fake tensors (data-dependent control flow, a custom kernel) falls back to a
formula, marked "approximate", with the module where tracing stopped.

`plan_training` keeps the configurations that fit a device's memory with a margin, cheapest
step first.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from accel_parallel import _memory_engines as rules
from accel_parallel import _memory_repeat as repeat
from accel_parallel import _memory_shard as shard
from accel_parallel import _memory_trace as trace

__all__ = [
    "ENGINES",
    "OPTIMIZERS",
    "MemoryEstimate",
    "estimate_training_memory",
    "parse_memory",
    "plan_training",
]

ENGINES = ("ddp", "fsdp2", "zero1", "zero2", "zero3")
TP_ENGINE = "tp"  # the engine of a mesh that splits tensors and does not shard (dp 1)
PP_ENGINE = "pp"  # a pipeline over every process
_ZERO_NOTE = "ZeRO partitioning applied by the ZeRO stage rules to the traced sizes"
OPTIMIZERS = tuple(trace.OPTIMIZERS)  # the optimizer names `optimizer=` takes
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """One configuration's per-device peak. `parts` add up to `peak_bytes`; `method` is
    "traced", "traced + <engine> rules" or "approximate"; `comm_bytes` and `host_bytes` are
    what one step moves per device over the interconnect and the host link."""

    engine: str
    world_size: int
    mixed_precision: str
    activation_checkpointing: bool
    offload: bool = False
    reshard_after_forward: bool | None = None
    tp_size: int = 1
    pp_size: int = 1
    stage_peaks: tuple[int, ...] = ()  # a pipeline's peak per stage (the row is the largest)
    parts: dict[str, int]
    method: str
    comm_bytes: int = 0
    host_bytes: int = 0
    notes: tuple[str, ...] = ()

    @property
    def peak_bytes(self) -> int:
        return sum(self.parts.values())

    @property
    def step_cost(self) -> float:
        """Ranking key for a plan: bytes moved per step, more with recomputation."""
        return rules.step_cost(self.comm_bytes, self.host_bytes, self.activation_checkpointing)

    def label(self) -> str:
        degree = {TP_ENGINE: self.tp_size, PP_ENGINE: self.pp_size}.get(self.engine)
        bits = [self.engine if degree is None else f"{self.engine}{degree}"]
        if self.tp_size > 1 and self.engine != TP_ENGINE:
            bits.append(f"tp{self.tp_size}")
        if self.reshard_after_forward is False:
            bits.append("no-reshard")
        if self.offload:
            bits.append("offload")
        if self.activation_checkpointing:
            bits.append("ac")
        return "+".join(bits)

    def as_row(self) -> dict[str, Any]:
        """The JSON row: engine, its options, peak_bytes, the breakdown and how it was made."""
        return {
            "engine": self.engine,
            "world_size": self.world_size,
            "tp_size": self.tp_size,
            "pp_size": self.pp_size,
            **({"stage_peak_bytes": list(self.stage_peaks)} if self.stage_peaks else {}),
            "offload": self.offload,
            "reshard_after_forward": self.reshard_after_forward,
            "activation_checkpointing": self.activation_checkpointing,
            "mixed_precision": self.mixed_precision,
            "peak_bytes": self.peak_bytes,
            **{f"{k}_bytes": v for k, v in self.parts.items()},
            "comm_bytes_per_step": self.comm_bytes,
            "host_bytes_per_step": self.host_bytes,
            "method": self.method,
            "notes": list(self.notes),
        }


def parse_memory(value: str | int | float) -> int:
    """`80GiB`, `24GB`, `512MiB` or a number of bytes -> bytes."""
    if isinstance(value, int | float):
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(
            f"memory {value!r}: expected a number with an optional unit "
            f"({', '.join(u for u in _UNITS if u)}), e.g. 80GiB."
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _check(engines: Iterable[str], world_size: int, parallelism: Any) -> tuple[list[str], int, int]:
    """The engines asked for and the tensor-parallel and pipeline degrees, checked."""
    engines = list(engines)
    known = (*ENGINES, TP_ENGINE, PP_ENGINE)
    unknown = [e for e in engines if e not in known]
    if unknown:
        raise ValueError(f"engines {unknown}: expected some of {list(known)}.")
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: expected at least 1.")
    if parallelism is None:
        return engines, 1, 1
    size = {k: int(getattr(parallelism, f"{k}_size", 1) or 1)
            for k in ("tp", "pp", "cp", "dp_replicate")}  # fmt: skip
    if size["cp"] > 1 or size["dp_replicate"] > 1:
        raise NotImplementedError(
            f"cp_size={size['cp']}, dp_replicate_size={size['dp_replicate']}: context and "
            "replicated (HSDP) degrees are not estimated yet; estimate with those at 1 "
            "(tp_size, pp_size and the data-parallel engines are estimated)."
        )
    tp = size["tp"]
    if tp > 1 and world_size % tp:
        raise ValueError(
            f"tp_size={tp} does not divide world_size={world_size}: the mesh is tp_size x "
            f"dp_shard_size processes; pass a world size that is a multiple of {tp}."
        )
    return engines, tp, size["pp"]


class _Tracer:
    """Runs (and caches) the traced steps one estimate needs."""

    def __init__(self, model: Any, batch: Any, batch_size: int, seq_len: int | None,
                 optimizer: str, mixed_precision: str, group: Any = None,
                 parallelism: Any = None) -> None:  # fmt: skip
        self.model, self.batch, self.group = model, batch, group
        self.parallelism = parallelism  # with tp_size > 1: traced on the device mesh
        self.batch_size, self.seq_len = batch_size, seq_len
        self.optimizer = optimizer
        self.make_optimizer = trace.optimizer_factory(optimizer)
        self.mixed_precision = mixed_precision
        self.cache: dict[tuple, tuple[trace.Traced | None, trace.Sizes, str | None]] = {}
        self._template: nn.Module | None = None
        self.blocks: repeat.Blocks | None = None
        self.count: int | None = None  # with `blocks`: trace only this many of them

    def truncated(self, blocks: repeat.Blocks, count: int) -> _Tracer:
        """A tracer of the same model holding only the first `count` of `blocks`."""
        other = _Tracer(self.model, self.batch, self.batch_size, self.seq_len, self.optimizer,
                        self.mixed_precision, self.group, self.parallelism)  # fmt: skip
        other._template, other.blocks, other.count = self.template(), blocks, count
        return other

    def sizes(self, ac: bool, reshard: bool = True) -> trace.Sizes:
        """The model's sizes (the traced copy's, when truncated)."""
        from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin
        from accel_parallel._parallelize import fsdp_units

        plugin = FullyShardedDataParallelPlugin(
            reshard_after_forward=reshard, activation_checkpointing=ac
        )
        source = self.template()
        with repeat.truncated(self.blocks, self.count):
            return trace.sizes_of(source, fsdp_units(source, plugin))

    def template(self) -> nn.Module:
        """The model built once (on the meta device for a factory), copied for each trace."""
        if self._template is None:
            self._template = trace.template(self.model)
        return self._template

    def run(
        self, world_size: int | None, ac: bool, reshard: bool = True, cast: bool = False
    ) -> tuple:
        """(Traced or None, sizes, failure) for the plain model (world_size None) or FSDP2;
        with `cast`, the plain model cast to the mixed-precision dtype and run without autocast
        (as DeepSpeed runs bf16/fp16). The sizes are the model's own, before any cast."""
        key = (world_size, ac, reshard, cast and self.mixed_precision != "no")
        if key not in self.cache:
            self.cache[key] = self._run(*key)
        return self.cache[key]

    def _run(self, world_size: int | None, ac: bool, reshard: bool, cast: bool) -> tuple:
        if world_size is None or self.group is not None:
            return self._trace(world_size, ac, reshard, cast)
        with trace.fake_process_group(world_size):
            return self._trace(world_size, ac, reshard, cast)

    def _trace(self, world_size: int | None, ac: bool, reshard: bool, cast: bool) -> tuple:
        from torch._subclasses.fake_tensor import FakeTensorMode

        from accel_parallel._fsdp import FSDP2Strategy
        from accel_parallel._fsdp_plugin import FullyShardedDataParallelPlugin
        from accel_parallel._parallelize import apply_activation_checkpointing, fsdp_units
        from accel_parallel._strategy import ProcessInfo

        plugin = FullyShardedDataParallelPlugin(
            reshard_after_forward=reshard, activation_checkpointing=ac
        )
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        strategy = None
        info = ProcessInfo(torch.device("cpu"), world_size or 1, 0)
        if world_size is not None and self.parallelism is not None:
            strategy = _mesh_strategy(info, self.parallelism, plugin, self.mixed_precision)
        elif world_size is not None:
            strategy = FSDP2Strategy(info, plugin, self.mixed_precision)
            if self.group is not None:
                from torch.distributed.device_mesh import DeviceMesh

                strategy._mesh = DeviceMesh.from_group(self.group, "cpu")
        sizes = self.sizes(ac, reshard)
        precision = self.mixed_precision
        dtype = None
        if cast and precision != "no":  # as DeepSpeed runs bf16/fp16: no autocast
            dtype, precision = trace.AUTOCAST[precision], "no"
        with repeat.truncated(self.blocks, self.count):
            model = trace.fake_model(self.template(), mode, dtype)
        if strategy is not None:
            # outside fake mode, as `prepare` applies it: the parameters are fake, so their
            # shards are too, while the meshes (FSDP2's dp x tp one included) are real; each
            # parameter's shard made alone, not one chunk per rank (see `_memory_shard`)
            with shard.sharding_by_index():
                strategy.parallelize(model)
        with mode:
            if strategy is None and ac:
                apply_activation_checkpointing(model, fsdp_units(model, plugin))
            opt = self.make_optimizer(model.parameters())
            batch = self.batch(model) if callable(self.batch) else trace.faked(self.batch, mode)
            if batch is None:
                batch = trace.default_batch(model, self.batch_size, self.seq_len)
            try:
                sharded = strategy is not None and strategy.fsdp_plugin is not None
                with warnings.catch_warnings():  # a tensor-parallel loss is a view: FSDP2 warns
                    warnings.filterwarnings("ignore", "FSDP2-wrapped module .* view tensor")
                    traced = trace.run_traced(model, opt, batch, precision, sharded)
            except trace.TraceError as exc:
                return None, sizes, f"could not trace {exc.module} ({type(exc.cause).__name__})"
        return traced, sizes, None


def _mesh_strategy(info: Any, parallelism: Any, plugin: Any, mixed_precision: str) -> Any:
    """The mesh strategy of tp_size x (world / tp_size) sharded ranks, as `prepare` makes it
    for a ParallelismConfig with these degrees (its tp_plan kept)."""
    from accel_parallel._mesh import MeshStrategy
    from accel_parallel._parallelism_config import ParallelismConfig

    tp = parallelism.tp_size
    config = ParallelismConfig(tp_size=tp, dp_shard_size=info.num_processes // tp,
                               tp_plan=getattr(parallelism, "tp_plan", None))  # fmt: skip
    return MeshStrategy(info, config, plugin, mixed_precision)


class _Sized:
    """The traced steps of `traced` with the sizes of `sized`'s model."""

    def __init__(self, traced: _Tracer, sized: _Tracer) -> None:
        self.traced, self.sized = traced, sized

    def run(self, world_size: int | None, ac: bool, reshard: bool = True,
            cast: bool = False) -> tuple:  # fmt: skip
        traced, _, failure = self.traced.run(world_size, ac, reshard, cast)
        return traced, self.sized.sizes(ac, reshard), failure


def _approximate(
    sizes: trace.Sizes, optimizer: str, failure: str
) -> tuple[dict[str, int], tuple[str, ...]]:
    states = {"sgd": 1, "adagrad": 1, "rmsprop": 1}.get(optimizer.lower(), 2)
    notes = (failure, "approximate: formula for weights, gradients and optimizer states; "
             "activations not included")  # fmt: skip
    return rules.formula(sizes, states), notes


def estimate_training_memory(
    model: nn.Module | Callable[[], nn.Module],
    *,
    world_size: int = 1,
    batch_size: int = 1,
    seq_len: int | None = None,
    batch: Any = None,
    engines: Iterable[str] = ENGINES,
    mixed_precision: str = "no",
    optimizer: str = "adamw",
    activation_checkpointing: bool | Iterable[bool] = False,
    offload: Iterable[bool] = (False, True),
    reshard_after_forward: Iterable[bool] = (True, False),
    parallelism: Any = None,
    group: Any = None,
    extrapolate: bool = True,
) -> list[MemoryEstimate]:
    """The per-device peak of one training step for each engine and option.

    `model` is a factory (run on the meta device, then faked) or a module (copied with fake
    tensors; nothing is allocated). `batch` is the example batch (a tensor, a tuple of args, a
    dict of keyword arguments, or a callable of the faked model that makes one); by default
    token ids of `batch_size` x `seq_len` (with labels) for a model with a vocabulary, random
    features for a model that starts with a Linear. The loss is the output's `.loss`, else
    its mean. FSDP2 is traced over a fake process group made here, or, where a process
    group is already initialized, over `group`: one made by every rank with
    ``torch.distributed.new_group(backend="fake")``, of `world_size` ranks.

    `parallelism` (a ParallelismConfig, or anything with `tp_size`): with tp_size > 1 the
    step is traced on the device mesh as `prepare` builds it, tensor parallel over tp_size
    ranks (the model's tp_plan, or the config's) and FSDP2 over world_size / tp_size; the
    rows are the mesh's ("fsdp2" with `tp_size`, or "tp" alone). With pp_size equal to
    world_size, one "pp" row: each stage traced alone on one micro-batch, with the 1F1B or
    GPipe rule for the micro-batches it holds (`_memory_pipeline`); the row is the most loaded
    stage, `stage_peaks` has every stage's. Context and replicated degrees, and a pipeline
    beside other degrees, are refused.

    With `extrapolate` (the default), a model of more than 5 identical blocks (a decoder's
    layers) is traced with 3, 4 and 5 of them and each part extended linearly to N (several
    times faster for a large N; the row's `method` says so); the rows then agree with the
    whole model's trace only while the peak stays at the same moment of the step from 5
    blocks to N (a moment that grows faster with the blocks can overtake it, and the result
    is then short: by 8 KiB of 28 MB for ZeRO-1 on a small Llama of 8 layers). Models
    without such blocks, or whose three traces do not lie on one line, are traced whole;
    `extrapolate=False` traces every model whole.
    """
    engines, tp, pp = _check(engines, world_size, parallelism)
    trace.check_precision(mixed_precision)
    acs = (
        [activation_checkpointing]
        if isinstance(activation_checkpointing, bool)
        else list(activation_checkpointing)
    )
    if group is not None and group.size() != world_size:
        raise ValueError(
            f"group has {group.size()} ranks, world_size={world_size}: make them equal."
        )
    if pp > 1:
        if any(acs):
            raise NotImplementedError(
                f"activation_checkpointing with pp_size={pp} is not estimated yet; estimate the "
                "pipeline without it."
            )
        tracer = _Tracer(model, batch, batch_size, seq_len, optimizer, mixed_precision)
        return [_pp_row(tracer, parallelism, world_size, mixed_precision)]
    if tp > 1 and group is not None:
        raise NotImplementedError(
            f"tp_size={tp} with a process group: the mesh is traced over a fake process group "
            "made here; estimate before init_process_group or in a separate process."
        )
    tracer = _Tracer(model, batch, batch_size, seq_len, optimizer, mixed_precision, group,
                     parallelism if tp > 1 else None)  # fmt: skip
    common = {"world_size": world_size, "mixed_precision": mixed_precision}
    offload, reshards = list(offload), list(reshard_after_forward)

    def rows(source: _Tracer | _Sized) -> list[MemoryEstimate]:
        out: list[MemoryEstimate] = []
        if tp > 1:
            for ac in acs:
                for reshard in reshards if world_size > tp else [True]:
                    out.extend(_tp_rows(source, ac, reshard, tp, engines, optimizer, common))
            return out
        for ac in acs:
            if any(e != "fsdp2" for e in engines):
                out.extend(_derived_rows(source, engines, ac, offload, optimizer, common))
            if "fsdp2" in engines:
                for reshard in reshards:
                    out.extend(_fsdp2_rows(source, ac, reshard, offload, optimizer, common))
        return out

    return (extrapolate and _extrapolated(tracer, rows, world_size)) or rows(tracer)


def _extrapolated(
    tracer: _Tracer, rows: Callable[[Any], list[MemoryEstimate]], world_size: int
) -> list[MemoryEstimate] | None:
    """The rows of a model of N identical blocks from traces of FIRST, FIRST + 1 and
    FIRST + 2 of them, each part extended linearly to N (see `_memory_repeat`); None (trace
    the whole model) without such blocks, when a block's size does not divide by the world
    size, when a copy cannot be traced, or when the three do not lie on one line."""
    blocks = repeat.repeated_blocks(tracer.template())
    if blocks is None:
        return None
    block = blocks.container[0]
    params = list(block.parameters())
    if any(x % world_size for x in (sum(p.numel() for p in params),
                                    sum(p.numel() * p.element_size() for p in params))):  # fmt: skip
        return None
    counts = range(repeat.FIRST, repeat.FIRST + 3)
    copies = [tracer.truncated(blocks, k) for k in counts]
    traced = [rows(c) for c in copies]
    if any(r.method == "approximate" for variant in traced for r in variant):
        return None
    method = (f"{counts[0]}, {counts[1]} and {counts[2]} of {blocks.count} "
              f"{type(block).__name__} blocks, extrapolated")  # fmt: skip
    out = []
    for row, *variants in zip(rows(_Sized(copies[0], tracer)), *traced, strict=True):
        parts = repeat.extrapolate([v.parts for v in variants], blocks.count)
        if parts is None:
            return None
        out.append(dataclasses.replace(row, parts=parts, method=f"{row.method} ({method})"))
    return out


def _derived_rows(tracer: _Tracer | _Sized, engines: list[str], ac: bool, offload: Iterable[bool],
                  optimizer: str, common: dict) -> list[MemoryEstimate]:  # fmt: skip
    """DDP and ZeRO rows: the plain model's traced step, with the engines' rules."""
    world_size, precision = common["world_size"], common["mixed_precision"]
    rows = []
    for engine in engines:
        if engine == "fsdp2":
            continue
        # DDP runs the model under autocast; DeepSpeed casts it to the bf16/fp16 dtype
        traced, sizes, failure = tracer.run(None, ac, cast=engine != "ddp")
        if traced is None:
            base, notes = _approximate(sizes, optimizer, failure)
            moments = [base]
        else:
            base, notes = rules.by_category(traced.peak, trace.CATEGORY_OF), ()
            moments = [rules.by_category(m, trace.CATEGORY_OF) for m in traced.moments]
        method = "traced" if traced is not None else "approximate"
        if engine == "ddp":
            parts, comm, note = rules.ddp(base, sizes, world_size)
            rows.append(MemoryEstimate(
                engine="ddp", activation_checkpointing=ac, parts=parts, comm_bytes=comm,
                method=method if world_size == 1 else f"{method} + DDP rules",
                notes=(*notes, note), **common,
            ))  # fmt: skip
            continue
        stage = int(engine[-1])
        for off in offload:
            # the rule applied at every recorded moment: sharding may move the peak
            parts, comm, host = max(
                (rules.zero(m, sizes, stage, world_size, precision, off) for m in moments),
                key=lambda result: sum(result[0].values()),
            )
            rows.append(MemoryEstimate(
                engine=engine, activation_checkpointing=ac, offload=off, parts=parts,
                method=f"{method} + ZeRO-{stage} stage rules", comm_bytes=comm,
                host_bytes=host, notes=(*notes, _ZERO_NOTE), **common,
            ))  # fmt: skip
    return rows


def _fsdp2_rows(tracer: _Tracer | _Sized, ac: bool, reshard: bool, offload: Iterable[bool],
                optimizer: str, common: dict) -> list[MemoryEstimate]:  # fmt: skip
    """FSDP2 rows: the step traced with FSDP2 applied; offload by its rule."""
    world_size = common["world_size"]
    traced, sizes, failure = tracer.run(world_size, ac, reshard)
    comm = rules.fsdp2_cost(sizes, world_size, common["mixed_precision"], reshard)
    rows = []
    for off in offload:
        kw = {"engine": "fsdp2", "activation_checkpointing": ac, "offload": off,
              "reshard_after_forward": reshard, "comm_bytes": comm, **common}  # fmt: skip
        if traced is None:
            parts, notes = _approximate(sizes, optimizer, failure)
            for k in ("weights", "gradients", "optimizer_states"):
                parts[k] = 0 if off else parts[k] // world_size
            rows.append(MemoryEstimate(parts=parts, method="approximate", notes=notes, **kw))
        elif off:
            parts, host = max(
                (rules.fsdp2_offload(m, trace.CATEGORY_OF, sizes, world_size)
                 for m in traced.moments),
                key=lambda result: sum(result[0].values()),
            )  # fmt: skip
            rows.append(MemoryEstimate(parts=parts, method="traced + CPU offload rule", host_bytes=host,
                notes=("the traced FSDP2 step less the sharded parameters, gradients and "
                       "optimizer states, which offload keeps on the host",), **kw))  # fmt: skip
        else:
            parts = rules.by_category(traced.peak, trace.CATEGORY_OF)
            rows.append(MemoryEstimate(parts=parts, method="traced", **kw))
    return rows


def _tp_rows(tracer: _Tracer | _Sized, ac: bool, reshard: bool, tp: int, engines: list[str],
             optimizer: str, common: dict) -> list[MemoryEstimate]:  # fmt: skip
    """The mesh's row: tensor parallel over `tp` ranks, FSDP2 over the world / tp others
    (engine "fsdp2"), or tensor parallel alone (engine "tp"). The data-parallel engines
    other than FSDP2 do not run with a tensor split in accel; they get no row."""
    world_size, precision = common["world_size"], common["mixed_precision"]
    dp = world_size // tp
    engine = "fsdp2" if dp > 1 else TP_ENGINE
    if engine not in engines and not (engine == TP_ENGINE and "fsdp2" in engines):
        return []
    traced, sizes, failure = tracer.run(world_size, ac, reshard)
    comm = rules.fsdp2_cost(sizes, dp, precision, reshard) // tp if dp > 1 else 0
    kw = {"engine": engine, "activation_checkpointing": ac, "tp_size": tp,
          "reshard_after_forward": reshard if dp > 1 else None, **common}  # fmt: skip
    split = (f"tensor parallel over {tp} ranks" + (f", FSDP2 over {dp}" if dp > 1 else "")
             + "; CPU offload is not estimated with a tensor split")  # fmt: skip
    if traced is None:
        parts, notes = _approximate(sizes, optimizer, failure)
        for k in ("weights", "gradients", "optimizer_states"):
            parts[k] //= world_size
        return [MemoryEstimate(parts=parts, method="approximate", comm_bytes=comm,
                               notes=(*notes, split), **kw)]  # fmt: skip
    parts = rules.by_category(traced.peak, trace.CATEGORY_OF)
    comm += traced.collective_bytes
    return [MemoryEstimate(parts=parts, method="traced", comm_bytes=comm, notes=(split,), **kw)]


def _pp_row(tracer: _Tracer, parallelism: Any, world_size: int,
            mixed_precision: str) -> MemoryEstimate:  # fmt: skip
    """The pipeline's row: its most loaded stage (see `_memory_pipeline`)."""
    from accel_parallel import _memory_pipeline as pipe

    template = tracer.template()
    batch = tracer.batch(template) if callable(tracer.batch) else tracer.batch
    if batch is None:
        batch = trace.default_batch(template, tracer.batch_size, tracer.seq_len)
    if not isinstance(batch, dict) or not {"input_ids", "labels"} <= set(batch):
        raise ValueError(
            "the pipeline estimate runs the stages on a batch of input_ids and labels; pass "
            "batch={'input_ids': ..., 'labels': ...} (or a model with a vocabulary)."
        )
    pp = parallelism.pp_size
    schedule, micro = pipe.pipeline_config(parallelism, world_size, batch["input_ids"].shape[0])
    stages = pipe.stage_traces(template, parallelism, batch, micro, tracer.make_optimizer,
                               mixed_precision)  # fmt: skip
    per_stage = []
    for index, (traced, saved, received, sent, grads) in enumerate(stages):
        held = pipe.in_flight(schedule, pp, index, micro)
        per_stage.append(pipe.stage_parts(traced, saved, received, sent, held, micro, grads))
    worst = max(range(pp), key=lambda i: sum(per_stage[i].values()))
    comm = max(micro * (received + sent) for _, _, received, sent, _ in stages)
    peaks = ", ".join(
        f"stage {i}: {sum(p.values()) / 2**20:.1f} MiB" for i, p in enumerate(per_stage)
    )
    return MemoryEstimate(
        engine=PP_ENGINE, world_size=world_size, mixed_precision=mixed_precision,
        activation_checkpointing=False, pp_size=pp, parts=per_stage[worst], comm_bytes=comm,
        stage_peaks=tuple(sum(p.values()) for p in per_stage),
        method=f"traced per stage + {schedule} rule",
        notes=(f"{schedule}, {micro} micro-batches; the peak is stage {worst}'s ({peaks})",),
    )  # fmt: skip


def plan_training(
    model: nn.Module | Callable[[], nn.Module],
    *,
    device_memory: int | str,
    margin: float = 0.1,
    **options: Any,
) -> list[MemoryEstimate]:
    """The configurations whose peak fits `device_memory` less `margin` (a fraction), with
    and without activation checkpointing, cheapest step first (`MemoryEstimate.step_cost`).
    `options` are `estimate_training_memory`'s. Empty when nothing fits."""
    if not 0 <= margin < 1:
        raise ValueError(f"margin={margin}: expected a fraction in [0, 1), e.g. 0.1.")
    limit = parse_memory(device_memory) * (1 - margin)
    pipeline = getattr(options.get("parallelism"), "pp_size", 1) > 1  # estimated without
    options.setdefault("activation_checkpointing", (False,) if pipeline else (False, True))
    rows = estimate_training_memory(model, **options)
    fitting = [r for r in rows if r.peak_bytes <= limit]
    return sorted(fitting, key=lambda r: (r.step_cost, r.peak_bytes))
