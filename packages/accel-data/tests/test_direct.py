"""The loaders built directly, as a DataLoader is (accelerate's constructors), and what a
resume into another loader does."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader

from accel_data import (
    DataLoaderDispatcher,
    DataLoaderShard,
    DataLoaderStateMixin,
    SkipBatchSampler,
    SkipDataLoader,
    prepare_data_loader,
    skip_first_batches,
)

from ._datasets import Ids, Stream, ids


class EpochSampler(BatchSampler):
    """A batch sampler that records the epoch it is told."""

    def __init__(self, n: int, batch_size: int) -> None:
        super().__init__(range(n), batch_size, drop_last=False)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def test_loaders_are_dataloaders_built_from_a_dataset() -> None:
    shard = DataLoaderShard(list(range(10)), batch_size=4)
    dispatcher = DataLoaderDispatcher(range(10), batch_size=4)
    skip = SkipDataLoader(range(10), batch_size=4, skip_batches=1)
    for loader in (shard, dispatcher, skip):
        assert isinstance(loader, DataLoader) and isinstance(loader, DataLoaderStateMixin)
        assert isinstance(loader.base_dataloader, DataLoader)
        assert loader.batch_size == 4 and len(loader) == (2 if loader is skip else 3)
    with pytest.raises(AttributeError):
        _ = DataLoaderShard.base_dataloader
    flags = [(b.tolist(), shard.end_of_dataloader) for b in shard]
    assert flags == [([0, 1, 2, 3], False), ([4, 5, 6, 7], False), ([8, 9], True)]
    assert [b.tolist() for b in dispatcher] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert dispatcher.end_of_dataloader and dispatcher.remainder == 2
    assert [b.tolist() for b in skip] == [[4, 5, 6, 7], [8, 9]]
    assert pickle.loads(pickle.dumps(shard)).batch_size == 4


def test_direct_options_device_skip_and_epoch() -> None:
    loader = DataLoaderShard(Ids(6), device="meta", batch_size=2, skip_batches=1)
    batches = list(loader)
    assert [b["x"].device.type for b in batches] == ["meta", "meta"]
    assert len(list(loader)) == 2  # skip_batches applies to every iteration
    sampler = EpochSampler(8, 2)
    shard = DataLoaderShard(list(range(8)), batch_sampler=sampler, iteration=3)
    assert shard.iteration == 3
    next(iter(shard))
    assert sampler.epoch == 3
    shard.set_epoch(5)
    view = skip_first_batches(shard, 2)
    assert view.iteration == 5 and next(iter(view)).tolist() == [4, 5] and sampler.epoch == 5
    assert list(SkipBatchSampler(BatchSampler(range(8), 2, False), 3)) == [[6, 7]]


def test_stateful_variant_is_a_stateful_dataloader_with_torchdata_state() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    shard = DataLoaderShard(list(range(16)), batch_size=4, use_stateful_dataloader=True)
    assert isinstance(shard, stateful.StatefulDataLoader) and isinstance(shard, DataLoaderShard)
    assert shard.use_stateful_dataloader
    reference = stateful.StatefulDataLoader(list(range(16)), batch_size=4)
    seen = []
    for k, (mine, _) in enumerate(zip(shard, reference)):
        seen.append(mine)
        if k == 1:
            state = shard.state_dict()
            assert state == reference.state_dict()  # torchdata's own dict, one batch behind
    again = DataLoaderShard(list(range(16)), batch_size=4, use_stateful_dataloader=True)
    again.load_state_dict(state)
    assert [b.tolist() for b in again] == [b.tolist() for b in seen[2:]]
    fresh = DataLoaderShard(list(range(4)), batch_size=2, use_stateful_dataloader=True)
    assert isinstance(pickle.loads(pickle.dumps(fresh)), stateful.StatefulDataLoader)


def test_prepare_takes_a_stream_without_batch_size_and_subclasses() -> None:
    class MyShard(DataLoaderShard):
        pass

    loader = prepare_data_loader(DataLoader(Stream(5), batch_size=None), shard_class=MyShard)
    assert isinstance(loader, MyShard)
    assert [int(item["id"]) for item in loader] == [0, 1, 2, 3, 4]
    rank1 = prepare_data_loader(DataLoader(Stream(5), batch_size=None), None, 2, 1)
    assert [int(item["id"]) for item in rank1] == [1, 3, 0]  # whole items in turn, padded


def test_device_mesh_counts_data_parallel_ranks() -> None:
    class Mesh:
        mesh_dim_names = ("dp_shard", "tp")

        def __getitem__(self, name: str) -> Mesh:
            size = {"dp_shard": 2, "tp": 2}[name]
            return type("Sub", (), {"size": lambda self: size})()

    loader = prepare_data_loader(
        DataLoader(Ids(8), batch_size=2), num_processes=4, process_index=3, torch_device_mesh=Mesh()
    )
    assert loader.num_processes == 2 and loader.process_index == 1
    assert [ids(b) for b in loader] == [[2, 3], [6, 7]]


def test_a_position_saved_by_another_loader_warns_and_starts_at_the_beginning() -> None:
    long = prepare_data_loader(DataLoader(Ids(20), batch_size=2), num_processes=1, process_index=0)
    it = iter(long)
    for _ in range(7):
        next(it)
    state = long.state_dict()
    # The manual recipe that works with accelerate: a loader over the samples not yet seen.
    rest = prepare_data_loader(
        DataLoader(torch.utils.data.Subset(Ids(20), range(14, 20)), batch_size=2),
        num_processes=1, process_index=0,
    )  # fmt: skip
    with pytest.warns(UserWarning, match=r"dataset_length 20 then, 6 now.*starts at its begin"):
        rest.load_state_dict(state)
    assert [ids(b) for b in rest] == [[14, 15], [16, 17], [18, 19]]
    for other in (  # another batch size, sampler kind, number of processes
        DataLoader(Ids(20), batch_size=4),
        DataLoader(Ids(20), batch_size=2, shuffle=True),
    ):
        loader = prepare_data_loader(other, num_processes=1, process_index=0)
        with pytest.warns(UserWarning, match="saved by another loader"):
            loader.load_state_dict(state)
        assert len(list(loader)) == len(loader)
    two = prepare_data_loader(DataLoader(Ids(20), batch_size=2), num_processes=2, process_index=0)
    with pytest.warns(UserWarning, match="num_processes 1 then, 2 now"):
        two.load_state_dict(state)
    # A state written before the loader was recorded: a position past the end warns too.
    short = prepare_data_loader(DataLoader(Ids(8), batch_size=2), num_processes=1, process_index=0)
    old = {k: v for k, v in state.items() if k != "loader"}
    with pytest.warns(UserWarning, match="7 batches read, this loader has 4 per epoch"):
        short.load_state_dict(old)
    assert ids(next(iter(short))) == [0, 1]
    # The same loader resumes exactly, and skip_first_batches after a refused state works.
    same = prepare_data_loader(DataLoader(Ids(20), batch_size=2), num_processes=1, process_index=0)
    same.load_state_dict(state)
    assert ids(next(iter(same))) == [14, 15]
    with pytest.warns(UserWarning):
        rest.load_state_dict(state)
    assert [ids(b) for b in skip_first_batches(rest, 1)] == [[16, 17], [18, 19]]
    with pytest.raises(TypeError, match="use_stateful_dataloader=True"):
        SkipDataLoader(range(4), batch_size=2).load_state_dict({})


def test_dispatcher_resumes_and_the_state_has_accel_keys() -> None:
    loader = DataLoaderDispatcher(Ids(10), batch_size=3)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["batches_yielded"] == 1 and state["num_processes"] == 1
    again = DataLoaderDispatcher(Ids(10), batch_size=3)
    again.load_state_dict(state)
    assert [ids(b) for b in again] == [[3, 4, 5], [6, 7, 8], [9]]
    assert torch.equal(next(iter(again))["id"], torch.tensor([0, 1, 2]))


def test_skip_first_batches_of_a_plain_loader_is_a_dataloader_prepare_takes() -> None:
    skipped = skip_first_batches(DataLoader(Ids(10), batch_size=2, shuffle=True), 3)
    assert isinstance(skipped, DataLoader) and len(skipped) == 2
    ranks = [
        prepare_data_loader(skipped, num_processes=2, process_index=r, data_seed=7) for r in (0, 1)
    ]
    got = [ids(b) for loader in ranks for b in loader]
    flat = sorted(i for b in got for i in b)
    assert len(got) == 2 and len(set(flat)) == 4  # same shuffle on both ranks: no overlap
    stream = skip_first_batches(DataLoader(Stream(5), batch_size=2), 1)
    assert isinstance(stream, SkipDataLoader) and [ids(b) for b in stream] == [[2, 3], [4]]
