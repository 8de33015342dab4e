"""DataLoaderShard in one process: look-ahead, remainder, observer, epochs, resume, placement."""

from __future__ import annotations

import warnings
from collections import namedtuple

import pytest
import torch
from torch.utils.data import DataLoader

from accel_data import (
    DataLoaderConfiguration,
    prepare_data_loader,
    send_to_device,
    skip_first_batches,
)

from ._datasets import Ids, Stream, ids

Pair = namedtuple("Pair", ["a", "b"])


def _prep(dl, world=1, rank=0, **kw):
    return prepare_data_loader(dl, num_processes=world, process_index=rank, **kw)


def test_end_of_dataloader_is_set_when_the_last_batch_is_yielded() -> None:
    for dataset in (Ids(10), Stream(10)):
        loader = _prep(DataLoader(dataset, batch_size=3), world=2, rank=1)
        flags = [loader.end_of_dataloader for _ in loader]
        assert flags == [False] * (len(flags) - 1) + [True]
        assert loader.remainder == 4  # 10 samples, global batch 6: 4 real in the last one


def test_remainder_for_a_stream_of_unknown_length_is_found_at_its_end() -> None:
    loader = _prep(DataLoader(Stream(13), batch_size=2), world=3, rank=0)
    assert loader.remainder == -1 and loader.total_dataset_length is None
    seen = []
    for _ in loader:
        seen.append((loader.end_of_dataloader, loader.remainder))
    assert seen[-1] == (True, 1) and all(r == -1 for _, r in seen[:-1])
    full = _prep(DataLoader(Stream(12), batch_size=2), world=3, rank=0)
    assert [full.remainder for _ in full][-1] == 0
    assert _prep(DataLoader(Ids(12), batch_size=2), world=3, rank=0).remainder == 0
    assert _prep(DataLoader(Ids(13), batch_size=2, drop_last=True), world=3, rank=0).remainder == 0


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def begin(self, loader) -> None:
        self.events.append(("begin", id(loader)))

    def end(self, loader) -> None:
        self.events.append(("end", id(loader)))


def test_observer_sees_nested_loaders_and_early_exits() -> None:
    rec = Recorder()
    train = _prep(DataLoader(Ids(4), batch_size=2), iteration_observer=rec)
    evaluate = _prep(DataLoader(Ids(2), batch_size=2), iteration_observer=rec)
    for _ in train:
        for _ in evaluate:
            pass
    t, e = id(train), id(evaluate)
    assert rec.events == [
        ("begin", t),
        ("begin", e),
        ("end", e),
        ("begin", e),
        ("end", e),
        ("end", t),
    ]
    rec.events.clear()
    for _ in train:
        break
    assert rec.events == [("begin", t), ("end", t)]
    rec.events.clear()
    it = iter(train)
    next(it)
    del it  # garbage-collected mid-epoch
    assert rec.events == [("begin", t), ("end", t)]


def test_plain_shuffle_draws_each_epoch_from_the_generator_as_torch_does() -> None:
    # accelerate's default: the order is the user's generator's, epoch by epoch, so one
    # process sees exactly what a plain DataLoader would, and reseeding the generator
    # between epochs (after prepare) is honoured.
    plain_gen = torch.Generator().manual_seed(11)
    plain = DataLoader(Ids(20), batch_size=2, shuffle=True, generator=plain_gen)
    expected = [[i for b in plain for i in ids(b)] for _ in range(2)]
    g = torch.Generator().manual_seed(3)
    loader = _prep(DataLoader(Ids(20), batch_size=2, shuffle=True, generator=g))
    g.manual_seed(11)
    assert [[i for b in loader for i in ids(b)] for _ in range(2)] == expected
    # two ranks whose generators start alike draw one order and split it
    ranks = []
    for rank in range(2):
        gen = torch.Generator().manual_seed(11)
        dl = DataLoader(Ids(20), batch_size=2, shuffle=True, generator=gen)
        ranks.append([i for b in _prep(dl, world=2, rank=rank) for i in ids(b)])
    assert sorted(ranks[0] + ranks[1]) == list(range(20))
    assert [i for pair in zip(ranks[0][::2], ranks[0][1::2], ranks[1][::2], ranks[1][1::2])
            for i in pair] == expected[0]  # fmt: skip
    # no generator: one of the loader's own, seeded from torch's global RNG
    torch.manual_seed(5)
    a = _prep(DataLoader(Ids(20), batch_size=2, shuffle=True))
    torch.manual_seed(5)
    b = _prep(DataLoader(Ids(20), batch_size=2, shuffle=True))
    assert [ids(x) for x in a] == [ids(x) for x in b]


def test_generator_order_resumes_exactly_mid_epoch_and_between_epochs() -> None:
    def make(seed, **kw):
        gen = torch.Generator().manual_seed(seed)
        sampler = torch.utils.data.RandomSampler(Ids(10), generator=gen)  # not the loader's
        return _prep(DataLoader(Ids(10), batch_size=2, sampler=sampler, **kw))

    unbroken = make(1)
    full = [[i for b in unbroken for i in ids(b)] for _ in range(3)]
    for stop in ((0, 2), (1, 4)):  # mid-epoch; the last batch of epoch 1
        head, sd = _run(make(1), 3, stop)
        assert sd["order_generator_state"] is not None and sd["generator_state"] is not None
        resumed = make(99)  # another generator state: the saved one wins
        resumed.load_state_dict(sd)
        assert head + _run(resumed, 3)[0] == sum(full, [])
    # saved between epochs (after a full pass): the next epoch draws where it would have
    loader = make(1)
    _ = [b for b in loader]
    resumed = make(7)
    resumed.load_state_dict(loader.state_dict())
    assert [i for b in resumed for i in ids(b)] == full[1]


def test_seedable_shuffle_is_identical_on_every_rank_and_follows_set_epoch() -> None:
    g = torch.Generator().manual_seed(11)
    dl = DataLoader(Ids(20), batch_size=2, shuffle=True, generator=g)
    ranks = [_prep(dl, world=2, rank=r, use_seedable_sampler=True) for r in range(2)]
    for epoch in (0, 1, 0):
        order = []
        for loader in ranks:
            loader.set_epoch(epoch)
            order.append([i for b in loader for i in ids(b)])
        assert sorted(order[0] + order[1]) == list(range(20))
        if epoch == 0:
            first = order
    assert order == first  # set_epoch(0) again: the same order
    again = _prep(
        DataLoader(Ids(20), batch_size=2, shuffle=True, generator=g),
        world=2, rank=0, use_seedable_sampler=True,
    )  # fmt: skip
    assert [i for b in again for i in ids(b)] == first[0]  # from the generator's seed
    a = _prep(dl, data_seed=5, use_seedable_sampler=True)
    b = _prep(
        DataLoader(Ids(20), batch_size=2, shuffle=True), data_seed=5, use_seedable_sampler=True
    )
    assert [ids(x) for x in a] == [ids(x) for x in b]
    assert a.iteration == 1  # a full pass moves to the next epoch


def _run(loader, epochs, stop=None):
    """Iterate like a training script; stop (epoch, batch) returns the state dict there."""
    seen = []
    start = loader.iteration
    for epoch in range(start, epochs):
        loader.set_epoch(epoch)
        for k, batch in enumerate(loader):
            seen += ids(batch)
            if stop is not None and (epoch, k) == stop:
                return seen, loader.state_dict()
    return seen, None


@pytest.mark.parametrize("stop", [(0, 2), (1, 4), (1, 0)])
def test_resume_in_process_reads_no_skipped_sample(stop) -> None:
    make = lambda data: _prep(  # noqa: E731
        DataLoader(data, batch_size=3, shuffle=True), world=2, rank=1
    )
    torch.manual_seed(0)  # no seed given: the base seed is drawn from the global RNG
    full, _ = _run(make(Ids(30)), 3)
    torch.manual_seed(0)
    head, sd = _run(make(Ids(30)), 3, stop)
    torch.manual_seed(1)  # a new process draws another seed: the saved one must win
    data = Ids(30)
    restored = make(data)
    restored.load_state_dict(sd)
    tail, _ = _run(restored, 3)
    assert head + tail == full
    assert data.reads == tail  # the skipped samples were never read


def test_skip_first_batches_after_restore_does_not_skip_twice() -> None:
    make = lambda: _prep(DataLoader(Ids(24), batch_size=2, shuffle=True), data_seed=4)  # noqa: E731
    full, _ = _run(make(), 2)
    head, sd = _run(make(), 2, (0, 4))
    loader = make()
    loader.load_state_dict(sd)
    with pytest.warns(UserWarning, match="not skipped a second time"):
        active = skip_first_batches(loader, 5)
    assert active is loader
    tail = [i for b in active for i in ids(b)]
    loader.set_epoch(1)
    tail += [i for b in loader for i in ids(b)]
    assert head + tail == full
    # accelerate's idiom without a restore: skip_first_batches on a fresh loader
    fresh = make()
    view = skip_first_batches(fresh, 5)
    assert len(view) == len(fresh) - 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = [i for b in view for i in ids(b)] + [i for b in fresh for i in ids(b)]
    assert got == full[10:]
    assert [i for b in skip_first_batches(DataLoader(Ids(9), batch_size=2), 3) for i in ids(b)] == [
        6,
        7,
        8,
    ]


def test_state_dict_is_plain_and_names_another_world_size() -> None:
    loader = _prep(DataLoader(Ids(8), batch_size=2, shuffle=True, generator=torch.Generator()))
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    assert sd["epoch"] == 0 and sd["batches_yielded"] == 1 and sd["seed"] is None
    # the generator's state where the epoch began: the loader's generator is the sampler's
    assert isinstance(sd["generator_state"], torch.Tensor) and sd["order_generator_state"] is None
    other = _prep(DataLoader(Ids(8), batch_size=2), world=2, rank=0)
    with pytest.warns(UserWarning, match="num_processes 1 then, 2 now"):
        other.load_state_dict(sd)  # another loader's position: it starts at its beginning
    assert other.state_dict()["batches_yielded"] == 0
    with pytest.raises(KeyError, match="missing"):
        other.load_state_dict({"epoch": 0})


def test_nested_batches_are_placed_on_the_device() -> None:
    batch = {"a": [torch.ones(2), (torch.zeros(1), "s")], "p": Pair(torch.ones(1), 3)}
    moved = send_to_device(batch, "meta")
    assert moved["a"][0].device.type == "meta" and moved["a"][1][0].device.type == "meta"
    assert moved["a"][1][1] == "s" and isinstance(moved["p"], Pair) and moved["p"].b == 3
    loader = _prep(DataLoader(Stream(4), batch_size=2), device="meta", put_on_device=True)
    for b in loader:
        assert b["id"].device.type == "meta" and b["pair"][1].device.type == "meta"
    assert loader.device == torch.device("meta")


@pytest.mark.gpu
def test_batches_move_to_cuda_non_blocking() -> None:
    dl = DataLoader(Ids(6), batch_size=2, pin_memory=True)
    loader = _prep(dl, device="cuda", put_on_device=True, non_blocking=True)
    for b in loader:
        assert b["x"].is_cuda and b["id"].is_cuda
    torch.cuda.synchronize()


def test_errors_and_configuration() -> None:
    with pytest.raises(ValueError, match="batch size 3 does not divide across 2 processes"):
        _prep(DataLoader(Ids(8), batch_size=3), world=2, rank=0, split_batches=True)
    with pytest.raises(RuntimeError, match="no process group is initialized"):
        _prep(DataLoader(Ids(8), batch_size=2), world=2, rank=0, dispatch_batches=True)
    with pytest.raises(TypeError, match="data_seed must be None or an int"):
        DataLoaderConfiguration(data_seed="3")
    cfg = DataLoaderConfiguration(split_batches=True, data_seed=1)
    loader = _prep(DataLoader(Ids(8), batch_size=4), world=2, rank=1, **cfg.prepare_kwargs())
    assert [ids(b) for b in loader] == [[2, 3], [6, 7]]
    assert loader.batch_size == 2 and loader.total_batch_size == 4 and len(loader) == 2


def test_dispatch_in_one_process_and_stateful_loader() -> None:
    loader = _prep(DataLoader(Stream(5), batch_size=2), put_on_device=True, device="cpu")
    assert type(loader).__name__ == "DataLoaderDispatcher"
    assert [ids(b) for b in loader] == [[0, 1], [2, 3], [4]] and loader.remainder == 1
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    dl = stateful.StatefulDataLoader(Ids(10), batch_size=2, shuffle=True)
    prepared = _prep(dl, world=2, rank=0, data_seed=9)
    assert isinstance(prepared.base_dataloader, stateful.StatefulDataLoader)
    full, _ = _run(prepared, 2)
    fresh = stateful.StatefulDataLoader(Ids(10), batch_size=2, shuffle=True)
    again = _prep(fresh, world=2, rank=0, data_seed=9)
    head, sd = _run(again, 2, (0, 1))
    assert sd["_num_yielded"] == sd["_sampler_iter_yielded"] == 2  # torchdata's own state
    again2 = _prep(dl, world=2, rank=0, use_seedable_sampler=True)  # seed: the state dict's
    again2.load_state_dict(sd)
    assert head + _run(again2, 2)[0] == full
