"""Collectives and process control, for real, on 2 and 3 gloo processes."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import pytest
import torch

import accel_state as S
from accel_state.testing import DistributedTestError, run_distributed

Pair = namedtuple("Pair", ["a", "b"])


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    name: str


class _Rows:
    """The part of a datasets.Dataset that split_between_processes uses: len and select."""

    def __init__(self, n: int, rows: list[int] | None = None) -> None:
        self.rows = list(range(n)) if rows is None else rows

    def __len__(self) -> int:
        return len(self.rows)

    def select(self, indices: list[int]) -> _Rows:
        return _Rows(0, [self.rows[i] for i in indices])


def _collectives_worker() -> dict:
    state = S.PartialState()
    rank, world = state.process_index, state.num_processes
    out: dict = {"rank": rank, "world": world, "type": str(state.distributed_type)}
    out["backend"] = state.backend
    # uneven first dimension: rank r holds r+1 rows of value r
    t = torch.full((rank + 1, 2), float(rank))
    nested = {"t": t, "pair": Pair(torch.tensor([rank]), "keep"), "batch": Batch(t[:1], "n")}
    g = S.gather(nested)
    out["gather_t"] = g["t"].tolist()
    out["gather_pair_a"] = g["pair"].a.tolist()
    out["gather_pair_b"] = g["pair"].b
    out["gather_batch"] = (g["batch"].x.tolist(), g["batch"].name, type(g["batch"]).__name__)
    out["gather_scalar"] = S.gather(torch.tensor(float(rank))).tolist()
    out["gather_object"] = S.gather_object([f"r{rank}"] * (rank + 1))
    out["gather_object_dict"] = S.gather_object({"r": rank})
    b = S.broadcast({"v": torch.tensor([rank * 10.0, 1.0])}, from_process=world - 1)
    out["broadcast"] = b["v"].tolist()
    objs = [rank, "x"] if rank == 0 else [None, None]
    out["broadcast_object_list"] = S.broadcast_object_list(objs)
    out["reduce_sum"] = S.reduce(torch.tensor([float(rank)]), "sum").tolist()
    out["reduce_mean"] = S.reduce({"m": torch.tensor([float(rank)])}, "mean")["m"].tolist()
    out["reduce_max"] = S.reduce(torch.tensor([float(rank), -float(rank)]), "max").tolist()
    padded = S.pad_across_processes(torch.ones(rank + 1, 2), dim=0, pad_index=-1)
    out["pad"] = padded.tolist()
    out["pad_first"] = S.pad_across_processes(
        torch.ones(1, rank + 1), dim=1, pad_first=True
    ).tolist()
    with state.split_between_processes(list(range(7))) as part:
        out["split"] = part
    with state.split_between_processes(list(range(7)), apply_padding=True) as part:
        out["split_pad"] = part
    with state.split_between_processes({"a": [1, 2, 3, 4, 5], "s": "keep"}) as part:
        out["split_dict"] = part
    with state.split_between_processes(torch.arange(5)) as part:
        out["split_tensor"] = part.tolist()
    with state.split_between_processes(_Rows(5), apply_padding=True) as part:
        out["split_rows"] = part.rows  # a datasets.Dataset-like table: rows by select()
    order = []
    with state.main_process_first():
        order.append(rank)
    state.wait_for_everyone()
    calls = []
    state.on_main_process(lambda: calls.append("main"))()
    state.on_last_process(lambda: calls.append("last"))()
    state.on_process(process_index=1)(lambda: calls.append("one"))()
    S.on_local_main_process(lambda: calls.append("local"))()
    out["calls"] = calls
    # rng synchronization
    torch.manual_seed(100 + rank)
    gen = torch.Generator().manual_seed(200 + rank)
    S.synchronize_rng_states(["torch", "generator", "python", "numpy"], generator=gen)
    out["rng"] = (torch.rand(2).tolist(), torch.rand(2, generator=gen).tolist())
    S.set_seed(5, device_specific=True)
    out["seeded"] = torch.rand(1).item()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_real_processes(world: int) -> None:
    results = run_distributed(_collectives_worker, world_size=world)
    rows = [[float(r)] * 2 for r in range(world) for _ in range(r + 1)]
    for r, out in enumerate(results):
        assert out["rank"] == r and out["world"] == world
        assert out["type"] == "MULTI_CPU" and out["backend"] == "gloo"
        assert out["gather_t"] == rows
        assert out["gather_pair_a"] == list(range(world))
        assert out["gather_pair_b"] == "keep"
        assert out["gather_batch"] == ([[float(i)] * 2 for i in range(world)], "n", "Batch")
        assert out["gather_scalar"] == [float(i) for i in range(world)]
        assert out["gather_object"] == [f"r{i}" for i in range(world) for _ in range(i + 1)]
        assert out["gather_object_dict"] == [{"r": i} for i in range(world)]
        assert out["broadcast"] == [(world - 1) * 10.0, 1.0]
        assert out["broadcast_object_list"] == [0, "x"]
        assert out["reduce_sum"] == [float(sum(range(world)))]
        assert out["reduce_mean"] == [sum(range(world)) / world]
        assert out["reduce_max"] == [float(world - 1), 0.0]
        assert len(out["pad"]) == world and out["pad"][: r + 1] == [[1.0, 1.0]] * (r + 1)
        assert all(row == [-1.0, -1.0] for row in out["pad"][r + 1 :])
        assert out["pad_first"] == [[0.0] * (world - 1 - r) + [1.0] * (r + 1)]
        assert out["calls"] == (["main"] if r == 0 else []) + (
            ["last"] if r == world - 1 else []
        ) + (["one"] if r == 1 else []) + (["local"] if r == 0 else [])
    # contiguous split, the first ranks take the remainder
    splits = [out["split"] for out in results]
    assert sum(splits, []) == list(range(7))
    assert [len(s) for s in splits] == [len(s) for s in _expected_split(7, world)]
    assert all(len(out["split_pad"]) == -(-7 // world) for out in results)
    assert sum((out["split_dict"]["a"] for out in results), []) == [1, 2, 3, 4, 5]
    assert all(out["split_dict"]["s"] == "keep" for out in results)
    assert sum((out["split_tensor"] for out in results), []) == list(range(5))
    rows = [out["split_rows"] for out in results]
    assert sum(rows, [])[:5] == list(range(5)) and {len(r) for r in rows} == {-(-5 // world)}
    # every rank drew the same numbers after synchronization, different ones after device_specific
    assert all(out["rng"] == results[0]["rng"] for out in results)
    assert len({out["seeded"] for out in results}) == world


def _expected_split(n: int, world: int) -> list[list[int]]:
    return [list(range(*S.split_range(n, world, r))) for r in range(world)]


def test_single_process_collectives_are_identity() -> None:
    t = {"a": torch.arange(3)}
    assert S.gather(t) is t
    assert S.broadcast(t) is t
    assert S.pad_across_processes(t) is t
    assert S.reduce(torch.tensor([2.0]), "sum").tolist() == [2.0]
    assert S.gather_object([1, 2]) == [1, 2]
    assert S.broadcast_object_list([3]) == [3]


def _fails_on_rank_one() -> None:
    state = S.PartialState()
    if state.process_index == 1:
        raise ValueError("boom on one")
    state.wait_for_everyone()


def test_run_distributed_reports_failure_and_does_not_hang() -> None:
    with pytest.raises(DistributedTestError, match="boom on one"):
        run_distributed(_fails_on_rank_one, world_size=2, timeout=60)


def _gather_mismatch() -> None:
    state = S.PartialState()
    S.gather(torch.zeros(2, 1 + state.process_index))


def test_gather_mismatched_trailing_dims_is_a_clear_error() -> None:
    with pytest.raises(DistributedTestError, match="dimensions after the first differ"):
        run_distributed(_gather_mismatch, world_size=2)
