"""Property tests: per epoch the shards cover the dataset with the documented padding."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, SequentialSampler

from accel_data import (
    BatchSamplerShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    prepare_data_loader,
)

FAST = settings(max_examples=60, deadline=None)


def _shards(n, bs, world, drop_last, even, split):
    inner = BatchSampler(SequentialSampler(range(n)), bs, drop_last)
    return [BatchSamplerShard(inner, world, r, split, even) for r in range(world)]


@FAST
@given(
    n=st.integers(1, 60),
    bs=st.integers(1, 7),
    world=st.integers(1, 4),
    drop_last=st.booleans(),
    even=st.booleans(),
    split=st.booleans(),
)
def test_batch_sampler_shard_covers_dataset(n, bs, world, drop_last, even, split):
    if split:
        bs *= world
    shards = _shards(n, bs, world, drop_last, even, split)
    per_rank = [list(s) for s in shards]
    for shard, batches in zip(shards, per_rank):
        assert len(shard) == len(batches)
    seen = Counter(i for batches in per_rank for b in batches for i in b)
    total = bs if split else bs * world
    full = n // total * total
    if drop_last and not split:
        # only whole global batches: every sample of those, once
        assert seen == Counter(range(full))
    elif drop_last:
        assert seen == Counter(range(n // bs * bs))
    else:
        assert set(seen) == set(range(n))  # every sample seen at least once
    padded = even and not drop_last and world > 1  # one process has nothing to even out
    if not padded:
        assert all(c == 1 for c in seen.values())  # no padding: shards disjoint
    if padded or drop_last:
        assert len({len(b) for b in per_rank}) == 1  # same count everywhere
        per = bs // world if split else bs
        assert all(len(x) == per for b in per_rank for x in b)
    if padded:
        # padding only completes the final global batch, with the earliest samples
        rounds = -(-n // total)
        assert sum(seen.values()) == rounds * total
        extra = sum(seen.values()) - n
        assert (n % total) in (0, total - extra)
    # the observed remainder equals the documented one
    expected = 0 if drop_last else n % total
    assert shards[0].last_round_real == expected


@FAST
@given(
    n=st.integers(1, 50),
    bs=st.integers(1, 5),
    world=st.integers(1, 4),
    drop_last=st.booleans(),
    split=st.booleans(),
)
def test_iterable_shard_covers_stream(n, bs, world, drop_last, split):
    if split:
        bs *= world
    shards = [IterableDatasetShard(range(n), bs, drop_last, world, r, split) for r in range(world)]
    outs = [list(s) for s in shards]
    total = bs if split else bs * world
    assert len({len(o) for o in outs}) == 1
    for s, o in zip(shards, outs):
        assert len(s) == len(o)
    # interleave back into global batches: real samples first, padding (from the start) last
    part = total // world
    merged = (
        outs[0]
        if world == 1
        else [
            x
            for k in range(len(outs[0]) // part)
            for o in outs
            for x in o[k * part : (k + 1) * part]
        ]
    )
    if drop_last:
        assert merged == list(range(n // total * total))
    elif world == 1:  # one process: the stream as it is, its short batch kept short
        assert outs[0] == list(range(n))
    else:
        assert merged[:n] == list(range(n))
        assert all(x in range(n) for x in merged[n:])
        assert len(merged) == -(-n // total) * total
    assert shards[0].last_batch_real == (0 if drop_last else n % total)


@FAST
@given(n=st.integers(1, 40), seed=st.integers(0, 2**40), epoch=st.integers(0, 50))
def test_seedable_sampler_is_a_function_of_seed_and_epoch(n, seed, epoch):
    a, b = SeedableRandomSampler(range(n), seed=seed), SeedableRandomSampler(range(n), seed=seed)
    torch.manual_seed(epoch)  # the global RNG does not matter
    a.set_epoch(epoch)
    first = list(a)
    torch.rand(3)
    b.set_epoch(epoch)
    assert list(b) == first
    assert a.epoch == epoch + 1  # a full pass moves to the next epoch
    a.set_epoch(epoch)
    assert list(a) == first
    assert sorted(first) == list(range(n))


def test_seedable_sampler_draws_as_accelerates_does() -> None:
    theirs = pytest.importorskip("accelerate.data_loader").SeedableRandomSampler
    torch.manual_seed(3)  # both take torch's initial seed when given none
    for kwargs in ({}, {"data_seed": 5}, {"replacement": True, "num_samples": 70}):
        gen = torch.Generator()
        ours = SeedableRandomSampler(range(40), generator=gen, **kwargs)
        ref = theirs(range(40), generator=torch.Generator(), **kwargs)
        assert ours.initial_seed == ref.initial_seed
        assert [list(ours) for _ in range(3)] == [list(ref) for _ in range(3)]


def test_seedable_sampler_epochs_differ_and_replacement_works() -> None:
    s = SeedableRandomSampler(range(50), seed=7)
    e0 = list(s)
    s.set_epoch(1)
    assert list(s) != e0
    r = SeedableRandomSampler(range(5), replacement=True, num_samples=30, seed=1)
    drawn = list(r)
    assert len(drawn) == 30 and set(drawn) <= set(range(5))
    more = SeedableRandomSampler(range(4), num_samples=10, seed=2)
    assert len(list(more)) == 10 and Counter(more).most_common(1)[0][1] <= 3


def test_varying_batch_sizes_are_sharded_and_padded() -> None:
    batches = [[0, 1, 2], [3], [4, 5], [6, 7, 8, 9], [10]]
    shards = [BatchSamplerShard(batches, 2, r) for r in range(2)]
    assert [list(s) for s in shards] == [
        [[0, 1, 2], [4, 5], [10]],
        [[3], [6, 7, 8, 9], [0, 1, 2]],  # the missing batch repeats the first
    ]
    uneven = [list(BatchSamplerShard(batches, 2, r, even_batches=False)) for r in range(2)]
    assert uneven == [[[0, 1, 2], [4, 5], [10]], [[3], [6, 7, 8, 9]]]


def test_split_errors_name_the_values() -> None:
    inner = BatchSampler(SequentialSampler(range(10)), 5, False)
    with pytest.raises(ValueError, match="batch size 5 does not divide across 2 processes"):
        BatchSamplerShard(inner, 2, 0, split_batches=True)
    with pytest.raises(ValueError, match="process_index must be an int in \\[0, 2\\), got 2"):
        BatchSamplerShard(inner, 2, 2)
    with pytest.raises(ValueError, match="batch size 3 does not divide"):
        IterableDatasetShard(range(4), 3, num_processes=2, split_batches=True)


def test_one_process_keeps_the_short_last_batch_as_accelerate_does() -> None:
    # 66 samples in batches of 8: 8 full batches and one of 2, not one padded with repeats
    # (a padded batch changes every loss averaged over it, whatever gather_for_metrics trims).
    loader = torch.utils.data.DataLoader(range(66), batch_size=8)
    batches = [b.tolist() for b in prepare_data_loader(loader, num_processes=1, process_index=0)]
    assert [len(b) for b in batches] == [8] * 8 + [2]
    assert batches[-1] == [64, 65]
    stream = IterableDatasetShard(range(66), 8, False, 1, 0)
    assert list(stream) == list(range(66)) and len(stream) == 66
