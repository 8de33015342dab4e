"""Real 2-process runs: dispatch, sharded streams, shared seeds, resume in new processes."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from accel_data import prepare_data_loader

run_distributed = pytest.importorskip("accel_state.testing").run_distributed


# Defined here (not imported from a sibling test module): the workers load this file by path.
class Ids(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"id": torch.tensor(i)}


class Stream(torch.utils.data.IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield {"id": torch.tensor(i), "pair": (torch.tensor([i, i]), torch.tensor(i > 3))}


def ids(batch) -> list[int]:
    return batch["id"].tolist()


def _topology() -> tuple[int, int]:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    return dist.get_world_size(), dist.get_rank()


def _dispatch_and_shard_worker() -> dict:
    world, rank = _topology()
    out: dict = {}
    # dispatch: nested dict/tuple batches from a stream, uneven final batch (7 = 4 + 3)
    loader = prepare_data_loader(
        DataLoader(Stream(7), batch_size=2),
        num_processes=world, process_index=rank, device="cpu", put_on_device=True,
    )  # fmt: skip
    out["dispatch_type"] = type(loader).__name__
    rows = []
    for b in loader:
        rows.append(
            (ids(b), b["pair"][0].tolist(), b["pair"][1].tolist(), loader.end_of_dataloader)
        )
    out["dispatch"], out["dispatch_remainder"] = rows, loader.remainder
    uneven = prepare_data_loader(
        DataLoader(Ids(7), batch_size=2),
        num_processes=world, process_index=rank, dispatch_batches=True, even_batches=False,
    )  # fmt: skip
    out["uneven"] = [ids(b) for b in uneven]
    # sharded stream, each process reads it all and keeps its slice
    shard = prepare_data_loader(
        DataLoader(Stream(9), batch_size=2), num_processes=world, process_index=rank
    )
    out["stream"] = [(ids(b), shard.end_of_dataloader) for b in shard]
    out["stream_remainder"] = shard.remainder
    # a plain shuffle with no seed anywhere: rank 0's drawn seed is broadcast
    torch.manual_seed(1000 + rank)
    shuffled = prepare_data_loader(
        DataLoader(Ids(16), batch_size=2, shuffle=True), num_processes=world, process_index=rank
    )
    out["shuffled"] = [i for b in shuffled for i in ids(b)]
    return out


def test_dispatch_and_sharded_stream_on_two_processes() -> None:
    r0, r1 = run_distributed(_dispatch_and_shard_worker, world_size=2)
    assert r0["dispatch_type"] == "DataLoaderDispatcher"
    # global batches [0..3], [4..6] padded with sample 0 to 4 rows; 2 rows each
    assert r0["dispatch"] == [
        ([0, 1], [[0, 0], [1, 1]], [False, False], False),
        ([4, 5], [[4, 4], [5, 5]], [True, True], True),
    ]
    assert r1["dispatch"] == [
        ([2, 3], [[2, 2], [3, 3]], [False, False], False),
        ([6, 0], [[6, 6], [0, 0]], [True, False], True),
    ]
    assert r0["dispatch_remainder"] == r1["dispatch_remainder"] == 3
    assert r0["uneven"] == [[0, 1], [4, 5]] and r1["uneven"] == [[2, 3], [6]]
    assert r0["stream"] == [([0, 1], False), ([4, 5], False), ([8, 0], True)]
    assert r1["stream"] == [([2, 3], False), ([6, 7], False), ([1, 2], True)]
    assert r0["stream_remainder"] == r1["stream_remainder"] == 1
    assert sorted(r0["shuffled"] + r1["shuffled"]) == list(range(16))


STOPS = [(0, 3), (1, 6)]  # mid-epoch; the last batch of an epoch (resume crosses the boundary)


def _make_loader(world: int, rank: int) -> DataLoader:
    return prepare_data_loader(
        DataLoader(
            Ids(37), batch_size=3, shuffle=True, num_workers=2, persistent_workers=True,
            multiprocessing_context="fork",  # the test's classes are not importable by name
        ),
        num_processes=world, process_index=rank,
    )  # fmt: skip


def _train(loader, stop: tuple[int, int] | None, path: Path) -> list[int]:
    """A training-script loop over 3 epochs; saves its position at `stop` and stops there."""
    seen: list[int] = []
    for epoch in range(loader.iteration, 3):
        loader.set_epoch(epoch)
        for k, batch in enumerate(loader):
            seen += ids(batch)
            if (epoch, k) == stop:
                path.write_bytes(pickle.dumps(loader.state_dict()))
                return seen
    return seen


def _train_worker(folder: str, resume: bool) -> dict:
    world, rank = _topology()
    out: dict = {}
    for n, stop in enumerate(STOPS):
        path = Path(folder) / f"stop{n}-rank{rank}.pkl"
        if not resume:
            torch.manual_seed(7)  # no seed given: the loader draws one from the global RNG
            out[n] = _train(_make_loader(world, rank), stop, path)
            continue
        torch.manual_seed(99 + rank)  # a new process draws another seed: the saved one wins
        loader = _make_loader(world, rank)
        loader.load_state_dict(pickle.loads(path.read_bytes()))
        out[n] = _train(loader, None, path)
    if not resume:
        torch.manual_seed(7)
        out["full"] = _train(_make_loader(world, rank), None, Path(folder) / "unused")
    return out


def test_resume_in_new_processes_equals_an_unbroken_run(tmp_path) -> None:
    first = run_distributed(_train_worker, str(tmp_path), False, world_size=2)
    resumed = run_distributed(_train_worker, str(tmp_path), True, world_size=2)
    for rank in range(2):
        full = first[rank]["full"]
        assert len(full) == 3 * 7 * 3  # 37 samples, 7 batches of 3 per rank, padded
        for n in range(len(STOPS)):
            assert first[rank][n] + resumed[rank][n] == full
    epoch0 = first[0]["full"][:21] + first[1]["full"][:21]
    assert sorted(set(epoch0)) == list(range(37))
