"""The umbrella's data-loader module: accelerate's defaults from the running state, and the
loaders' link to the shared GradientState."""

from __future__ import annotations

import gc
import weakref

import torch
from torch.utils.data import DataLoader, IterableDataset

from accel import Accelerator, PartialState
from accel.data_loader import DataLoaderDispatcher, DataLoaderShard, prepare_data_loader
from accel.state import GradientState


class Ones(IterableDataset):
    def __iter__(self):
        return iter([torch.ones(1)] * 3)


def test_prepare_data_loader_defaults_to_the_running_state() -> None:
    state = PartialState()
    loader = prepare_data_loader(DataLoader(list(range(8)), batch_size=2))
    assert isinstance(loader, DataLoaderShard)
    assert (loader.num_processes, loader.process_index) == (state.num_processes, 0)
    assert loader.gradient_state is not None
    seen = []
    for batch in loader:
        seen.append((batch.tolist(), GradientState().active_dataloader is loader))
    assert seen[0] == ([0, 1], True) and GradientState().active_dataloader is None
    stream = prepare_data_loader(
        DataLoader(Ones(), batch_size=None), num_processes=2, process_index=1
    )
    assert [b.tolist() for b in stream] == [[1.0], [1.0]]


def test_direct_loaders_report_to_the_gradient_state() -> None:
    GradientState._reset_state()
    dispatcher = DataLoaderDispatcher(range(6), batch_size=2)
    assert GradientState._shared_state  # building one starts the shared state
    flags = []
    for _ in dispatcher:
        flags.append(GradientState().end_of_dataloader)
    assert flags == [False, False, True] and not GradientState().in_dataloader


def test_a_loader_left_mid_epoch_is_not_kept_alive() -> None:
    acc = Accelerator(cpu=True)
    loader = acc.prepare_data_loader(DataLoader(list(range(8)), batch_size=2))
    it = iter(loader)
    next(it)
    assert acc.gradient_state.active_dataloader is loader
    ref = weakref.ref(loader)
    del acc, loader, it
    gc.collect()
    assert ref() is None and GradientState().active_dataloader is None
