"""prepare_data_loader as accelerate spells it: the running state fills in who this process is.

accel_data takes the topology as arguments; here the umbrella reads it from PartialState,
hooks the loader to the shared GradientState (so `accumulate` and `gather_for_metrics`
see which loader is being iterated) and synchronizes random states at epoch starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

import accel_data
import accel_state
from accel._gradient_state import GradientState


class RngSyncObserver:
    """The gradient state's iteration observer, plus RNG synchronization at epoch starts."""

    def __init__(
        self,
        gradient_state: GradientState,
        rng_types: list[str],
        generator: torch.Generator | None = None,
    ) -> None:
        self.gradient_state = gradient_state
        self.rng_types = rng_types
        self.generator = generator

    def begin(self, loader: Any) -> None:
        self.gradient_state.begin(loader)
        if loader.state_dict().get("batches_yielded", 0) == 0:
            accel_state.synchronize_rng_states(self.rng_types, generator=self.generator)

    def end(self, loader: Any) -> None:
        self.gradient_state.end(loader)


class _TimedBatches:
    """The batches of a prepared loader, timed and counted by the Accelerator's StepMetrics
    when step metrics are on (`step_metrics` set by `prepare`), and moved to the device by the
    strategy's `batch_feeder` where it has one (XLA's parallel loader; set by `prepare`). The
    loader counts the batches it hands out, so a feeder that reads ahead keeps its position
    exact."""

    step_metrics: Any = None
    batch_feeder: Callable[[Iterator[Any]], Iterator[Any]] | None = None

    def _batches(self, skip: int) -> Iterator[Any]:
        batches = super()._batches(skip)  # type: ignore[misc]
        if self.batch_feeder is not None:
            batches = self.batch_feeder(batches)
        return batches if self.step_metrics is None else self.step_metrics.timed(batches)


class DataLoaderShard(_TimedBatches, accel_data.DataLoaderShard):
    """accel_data's DataLoaderShard that reports its iterations to the shared GradientState
    (its `gradient_state`), as the loaders of accelerate do, also when built directly; built
    directly with `rng_types`, it synchronizes those generators (`synchronized_generator` for
    "generator") from the main process at each epoch start, as accelerate's does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        synced = [str(getattr(t, "value", t)) for t in self.rng_types or ()]
        if self.synchronized_generator is None:
            synced = [t for t in synced if t != "generator"]
        if synced:
            self.iteration_observer = RngSyncObserver(
                self.gradient_state, synced, self.synchronized_generator
            )

    def _on_init(self) -> None:
        self.gradient_state = GradientState()
        self.iteration_observer = self.gradient_state


class DataLoaderDispatcher(_TimedBatches, accel_data.DataLoaderDispatcher):
    """accel_data's DataLoaderDispatcher that reports its iterations to the shared
    GradientState (its `gradient_state`), also when built directly."""

    def _on_init(self) -> None:
        self.gradient_state = GradientState()
        self.iteration_observer = self.gradient_state


def iteration_observer(gradient_state: GradientState, rng_types: list[Any] | None) -> Any:
    """What a prepared loader tells when an iteration starts and ends: the gradient state,
    and, with rng_types beyond "generator" (which the prepared loader syncs itself), the RNG
    synchronization at each epoch start."""
    synced = [str(getattr(t, "value", t)) for t in rng_types or ()]
    synced = [t for t in synced if t != "generator"]
    return RngSyncObserver(gradient_state, synced) if synced else gradient_state


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | str | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[Any] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> DataLoaderShard | DataLoaderDispatcher:
    """This process's share of `dataloader` (see `accel_data.prepare_data_loader`).

    `num_processes` and `process_index` default to the running PartialState's; the loader
    reports its iterations to the shared GradientState (its `gradient_state`).
    """
    state = accel_state.PartialState()
    gradient_state = GradientState()
    prepared = accel_data.prepare_data_loader(
        dataloader,
        device=device,
        num_processes=state.num_processes if num_processes is None else num_processes,
        process_index=state.process_index if process_index is None else process_index,
        split_batches=split_batches,
        put_on_device=put_on_device,
        rng_types=rng_types,
        dispatch_batches=dispatch_batches,
        even_batches=even_batches,
        slice_fn_for_dispatch=slice_fn_for_dispatch,
        use_seedable_sampler=use_seedable_sampler,
        data_seed=data_seed,
        non_blocking=non_blocking,
        use_stateful_dataloader=use_stateful_dataloader,
        torch_device_mesh=torch_device_mesh,
        iteration_observer=iteration_observer(gradient_state, rng_types),
        shard_class=DataLoaderShard,
        dispatcher_class=DataLoaderDispatcher,
    )
    prepared.gradient_state = gradient_state
    return prepared
