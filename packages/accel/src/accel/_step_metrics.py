"""Per-optimizer-step throughput, FLOPs, MFU, memory and data wait (`log_step_metrics`).

A `StepMetrics` exists only when asked for (`Accelerator(log_step_metrics=True)`, a
`StepMetricsKwargs` handler, or `accel launch --step_metrics`); otherwise the Accelerator,
its optimizers and its loaders hold None and make no call at all. When on:

- the prepared DataLoaders time how long producing each batch takes (the data wait) and
  count its samples and tokens (`attention_mask`'s ones, else `input_ids`' elements), which
  the next training forward of a prepared model adds to its step (an evaluation forward,
  under `no_grad` or in `eval()` mode, drops its own);
- the prepared models count FLOPs with `FlopCounterMode` over the real forward + backward of
  the micro-batches of each new input shape until two counts in a row agree, then cache the
  count per shape: later micro-batches of that shape add it;
- at each optimizer step the figures of the step (all its micro-batches) become
  `accelerator.step_metrics`, go to `accelerator.log` (keys prefixed "perf/") and, every
  `print_every` steps, to one printed line on the main process.

Aggregation over processes adds no collective: every rank measures its own step, and the
global figures are its own scaled by the number of ranks that share the work (samples and
tokens by the data-parallel size, FLOPs by the number of processes, since tensor-parallel
and pipeline ranks each do their part of the same batch). This assumes balanced ranks
(even batches); a straggler's slow step shows on its own rank's figures and, through the
gradient all-reduce that already makes every rank wait for it, on every rank's step time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from accel import _flops
from accel._config import StepMetricsKwargs
from accel_state import DeviceKind, device_entry, find_batch_size

# The keys of `accelerator.step_metrics` (documented, relied on by scripts and tests).
METRIC_KEYS = (
    "samples_per_sec",
    "tokens_per_sec",
    "flops_per_step",
    "tflops_per_sec",
    "mfu",
    "peak_memory_bytes",
    "data_wait_fraction",
)
LOG_PREFIX = "perf/"


class StepMetrics:
    """Collects one optimizer step's figures; `owner` is the Accelerator (its topology,
    precision and `log`)."""

    def __init__(self, owner: Any, options: StepMetricsKwargs) -> None:
        self.owner = owner
        self.options = options
        self.steps = 0
        # The last step's raw record, turned into figures when they are first read.
        self._last: tuple[Any, ...] | None = None
        self._metrics: dict[str, Any] | None = None
        self.peak: _flops.PeakFlops | None = None
        self._flops_cache: dict[tuple[Any, ...], tuple[int, bool]] = {}  # (flops, confirmed)
        self._counting: tuple[Any, tuple[Any, ...]] | None = None  # (mode, shape key)
        self._forwarded = False  # a training forward ran since the last step ended
        # (samples, tokens) of the batches handed out and not yet taken by a forward, in
        # order: a training forward adds them all to its step; an evaluation forward drops
        # the latest (its own: an evaluation loop inside a training loop leaves the training
        # batch that is waiting for its forward).
        self._pending: list[tuple[int, Any]] = []
        self._reset_step(None)

    def _reset_step(self, start: float | None) -> None:
        self._start = start
        self._samples = 0
        self._tokens: Any = 0
        self._tokens_known = False
        self._user_counts: tuple[int | None, int | None] | None = None
        self._flops = 0
        self._flops_known = False
        self._wait = 0.0

    def _open_window(self) -> None:
        if self._start is None:
            self._start = time.perf_counter()

    # -- what prepare wires in ---------------------------------------------------------------
    def watch_model(self, model: nn.Module) -> None:
        """Count the FLOPs of `model`'s forward + backward per input shape; look up the
        device's peak now, outside any step (the probe takes a fraction of a second)."""
        model.register_forward_pre_hook(self._forward_pre_hook, with_kwargs=True)
        if self.peak is None:
            dtype = _flops.compute_dtype(self.owner.mixed_precision, self.owner.device)
            self.peak = _flops.device_peak_flops(self.owner.device, dtype)

    def watch_loader(self, loader: Any) -> None:
        loader.step_metrics = self

    def watch_optimizer(self, optimizer: Any) -> None:
        optimizer.step_observer = self

    # -- the data loader ----------------------------------------------------------------------
    def timed(self, batches: Iterator[Any]) -> Iterator[Any]:
        """`batches`, timing each one's production. A prepared loader fetches one batch ahead,
        so a batch is counted when the next one is fetched (just before it is handed out)."""
        clock = time.perf_counter
        previous: Any = None
        have_previous = False
        while True:
            start = clock()
            self._open_window()
            try:
                batch = next(batches)
            except StopIteration:
                self._wait += clock() - start
                break
            self._wait += clock() - start
            if have_previous:
                self._count_batch(previous)
            previous, have_previous = batch, True
            yield batch
        if have_previous:
            self._count_batch(previous)

    def _count_batch(self, batch: Any) -> None:
        self._pending.append(batch_counts(batch))

    def _take_pending(self) -> None:
        for samples, tokens in self._pending:
            self._samples += samples
            if tokens is not None:
                self._tokens = self._tokens + tokens
                self._tokens_known = True
        self._pending.clear()

    def count(self, tokens: int | None = None, samples: int | None = None) -> None:
        """The user's counts for the current optimizer step (`count_step_tokens`)."""
        known_tokens, known_samples = self._user_counts or (None, None)
        if tokens is not None:
            known_tokens = (known_tokens or 0) + int(tokens)
        if samples is not None:
            known_samples = (known_samples or 0) + int(samples)
        self._user_counts = (known_tokens, known_samples)

    # -- the model ------------------------------------------------------------------------------
    def _forward_pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._open_window()
        if not (torch.is_grad_enabled() and module.training):
            if self._pending:  # evaluation: its batch is not part of a training step
                self._pending.pop()
            return
        self._forwarded = True
        if self._pending:
            self._take_pending()
        if self._counting is not None:
            return  # a second forward in the same micro-batch: counted in the open count
        key = (id(module), *_shapes(args), *_shapes(kwargs.values()))
        flops, confirmed = self._flops_cache.get(key, (0, False))
        if confirmed:
            self._flops += flops
            self._flops_known = True
            return
        mode = _flops.flop_counter()
        mode.__enter__()
        self._counting = (mode, key)

    def backward_done(self) -> None:
        """Close the FLOP count opened by this micro-batch's forward (if one is open)."""
        if self._counting is None:
            return
        mode, key = self._counting
        self._counting = None
        mode.__exit__(None, None, None)
        flops = int(mode.get_total_flops())
        # Kept once two counts in a row agree: a first call may do one-off work (a pipeline
        # schedule's shape inference runs an extra forward on its first step).
        self._flops_cache[key] = (flops, self._flops_cache.get(key, (None,))[0] == flops)
        self._flops += flops
        self._flops_known = True

    # -- the optimizer step -----------------------------------------------------------------------
    def optimizer_stepped(self, optimizer: Any) -> None:
        """One optimizer step completed: compute its figures, log and print them. The first
        optimizer step after a training forward ends a step (others that follow it without a
        forward in between belong to the same step)."""
        if not self._forwarded:
            return  # several optimizers step together: the first one ended the step
        self._forwarded = False
        self.backward_done()  # a backward not made through accelerator.backward
        device = self.owner.device
        memory = None
        entry = device_entry(device)
        if not entry.is_host:  # the step's kernels are done before the clock is read
            entry.synchronize(device)
            memory = _allocator_memory(entry, device)
        now = time.perf_counter()
        self.steps += 1
        seconds = now - (self._start if self._start is not None else now)
        tokens = self._tokens if self._tokens_known else None
        flops = self._flops if self._flops_known else None
        self._last = (seconds, self._samples, tokens, self._user_counts, flops, self._wait, memory)
        self._metrics = None
        self._reset_step(now)
        self._report()

    @property
    def metrics(self) -> dict[str, Any]:
        """The last completed step's figures (computed when first read); {} before one."""
        if self._metrics is None:
            self._metrics = {} if self._last is None else self._figures(*self._last)
        return self._metrics

    def _figures(
        self,
        seconds: float,
        samples: int,
        tokens: Any,
        user_counts: tuple[int | None, int | None] | None,
        flops: int | None,
        wait: float,
        memory: dict[str, int] | None,
    ) -> dict[str, Any]:
        data_parallel = self.owner.strategy.data_parallel_size
        processes = self.owner.num_processes
        counted: tuple[int | None, Any] = (samples or None, None if tokens is None else int(tokens))
        if user_counts is not None:
            counted = (
                counted[0] if user_counts[1] is None else user_counts[1],
                counted[1] if user_counts[0] is None else user_counts[0],
            )
        rate = 1.0 / seconds if seconds > 0 else float("nan")
        peak = self.peak.flops_per_sec if self.peak is not None else None
        figures: dict[str, Any] = {
            "samples_per_sec": None if counted[0] is None else counted[0] * data_parallel * rate,
            "tokens_per_sec": None if counted[1] is None else counted[1] * data_parallel * rate,
            "flops_per_step": None if flops is None else flops * processes,
            "tflops_per_sec": None if flops is None else flops * processes * rate / 1e12,
            "mfu": None if flops is None or not peak else flops * rate / peak,
            "peak_memory_bytes": None,
            "data_wait_fraction": wait * rate if seconds > 0 else None,
            "step_time_sec": seconds,
            # this process's own share, before scaling to the whole group
            "rank_samples_per_sec": None if counted[0] is None else counted[0] * rate,
            "rank_tokens_per_sec": None if counted[1] is None else counted[1] * rate,
            "rank_tflops_per_sec": None if flops is None else flops * rate / 1e12,
        }
        figures.update(memory or _process_peak_memory())
        return figures

    def _report(self) -> None:
        every_log, every_print = self.options.log_every, self.options.print_every
        if every_log and self.owner.trackers and self.steps % every_log == 0:
            values = {LOG_PREFIX + k: v for k, v in self.metrics.items() if v is not None}
            self.owner.log(values, step=self.steps)
        if every_print and self.steps % every_print == 0 and self.owner.is_main_process:
            print(format_line(self.steps, self.metrics, self.peak), file=sys.stdout, flush=True)


def batch_counts(batch: Any) -> tuple[int, Any]:
    """(samples, tokens) of a batch: tokens are `attention_mask`'s ones (a tensor, read when
    the step ends) or `input_ids`' elements; None when the batch has neither."""
    if isinstance(batch, (dict, Mapping)):
        mask, ids = batch.get("attention_mask"), batch.get("input_ids")
        if isinstance(mask, torch.Tensor) and mask.ndim >= 1:
            return int(mask.shape[0]), mask.sum()
        if isinstance(ids, torch.Tensor) and ids.ndim >= 1:
            return int(ids.shape[0]), ids.numel()
    return find_batch_size(batch) or 0, None


def _shapes(values: Any) -> list[tuple[int, ...]]:
    return [tuple(v.shape) for v in values if isinstance(v, torch.Tensor)]


def _allocator_memory(entry: DeviceKind, device: torch.device) -> dict[str, int] | None:
    """The step's peak of the device's caching allocator, allocated and reserved bytes (then
    reset, so that the next step's peak is its own); None where the device counts neither."""
    allocated = entry.max_memory_allocated(device)
    reserved = entry.max_memory_reserved(device)
    if allocated is None or reserved is None:
        return None
    entry.reset_peak_memory_stats(device)
    return {"peak_memory_bytes": allocated, "peak_memory_reserved_bytes": reserved}


def _process_peak_memory() -> dict[str, int]:
    """The process's peak resident set size (on a CPU, where no allocator counts)."""
    try:
        import resource
    except ImportError:  # Windows: the current resident set size instead of the peak
        import psutil

        return {"peak_memory_bytes": int(psutil.Process().memory_info().rss)}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_memory_bytes": int(peak if sys.platform == "darwin" else peak * 1024)}


def format_line(step: int, metrics: Mapping[str, Any], peak: _flops.PeakFlops | None) -> str:
    """The compact line printed every `print_every` steps."""
    parts = [f"step {step}"]
    if metrics.get("samples_per_sec") is not None:
        parts.append(f"{_si(metrics['samples_per_sec'])} samples/s")
    if metrics.get("tokens_per_sec") is not None:
        parts.append(f"{_si(metrics['tokens_per_sec'])} tok/s")
    if metrics.get("tflops_per_sec") is not None:
        parts.append(f"{metrics['tflops_per_sec']:.3g} TFLOP/s")
    if metrics.get("mfu") is not None and peak is not None:
        label = "" if peak.source == "table" else " of measured peak"
        parts.append(f"MFU {100 * metrics['mfu']:.1f}%{label}")
    if metrics.get("peak_memory_bytes") is not None:
        parts.append(f"mem {metrics['peak_memory_bytes'] / 2**30:.2f} GiB")
    if metrics.get("data_wait_fraction") is not None:
        parts.append(f"data wait {100 * metrics['data_wait_fraction']:.1f}%")
    return " | ".join(parts)


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"
