"""accel's DCP planners (accel_parallel.checkpoint.SavePlanner / LoadPlanner) against torch's.

The plans of every rank of a world of N come from `accel_testkit.scale_plans` (FSDP2's
Shard(0) arithmetic), checked here item for item against torch's own local plans of DTensors
over a fake process group. On them the coordinator's global plan and metadata must be
torch's, the validation must refuse what torch's refuses, and each rank's read items on resume
must be torch's. A checkpoint written by two gloo processes with accel's planner loads with
torch's stock loader, and one torch saved loads with accel's.
"""

from __future__ import annotations

import dataclasses
import os
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from accel_parallel.checkpoint import DCP_INDEX, LoadPlanner, SavePlanner
from accel_parallel.checkpoint._index import IndexedReader, IndexedWriter, read_index, write_index
from accel_parallel.checkpoint._planners import _read_items_in_order
from accel_state.testing import run_distributed
from accel_testkit import scale_plans

LLAMA_8B = scale_plans.llama_tensors()
# a small Llama whose 48-row tensors leave ranks past row 48 of 64 with empty shards
SMALL = scale_plans.llama_tensors((48, 96, 2, 16, 40))


@pytest.fixture
def fake_world():
    """init(n, rank): the default group is a fake one of n ranks, this process rank `rank`."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401 (registers "fake")

    try:
        from torch._C._distributed_c10d import FakeStore
    except ImportError:  # torch 2.9
        from torch.testing._internal.distributed.fake_pg import FakeStore

    def init(n: int, rank: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=n)

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


def dtensor_state(tensors: list, n: int, rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (n,))
    state = {}
    for name, shape in tensors:
        if shape:
            full = torch.zeros(shape, dtype=torch.bfloat16)
            state[name] = distribute_tensor(full, mesh, [Shard(0)], src_data_rank=None)
        else:
            state[name] = torch.tensor(0.0)
    return state


@pytest.mark.parametrize("n", [8, 64])
def test_scale_plans_are_torchs_local_plans(fake_world, n):
    """Each rank's plan from the arithmetic equals torch's local plan of its DTensors (the
    empty shards of ranks past a tensor's last row included)."""
    for rank in sorted({0, 1, n // 2, 47, n - 1} & set(range(n))):
        fake_world(n, rank)
        planner = DefaultSavePlanner()
        planner.set_up_planner({"model": dtensor_state(SMALL, n, rank)}, is_coordinator=rank == 0)
        theirs = planner.create_local_plan()
        ours = scale_plans.fsdp2_save_plans(SMALL, n, ranks=range(rank, rank + 1))[0]
        assert ours.items == theirs.items, rank
        assert ours.planner_data == theirs.planner_data


@pytest.mark.parametrize("n", [8, 64])
def test_global_plan_and_metadata_are_torchs(n):
    """On an 8B Llama's 291 tensors and its Adam state: the same global plan and metadata as
    torch's DefaultSavePlanner; each key has one chunk per rank, so the metadata grows by
    291 chunks per rank (and the optimizer's by 582 plus 291 deduplicated steps)."""
    for tensors, prefix, sharded in (
        (LLAMA_8B, "model", 291),
        (scale_plans.optimizer_tensors(LLAMA_8B), "optimizer", 582),
    ):
        plans = scale_plans.fsdp2_save_plans(tensors, n, prefix=prefix)
        ours = SavePlanner().create_global_plan(plans)
        theirs = DefaultSavePlanner().create_global_plan(plans)
        assert ours == theirs
        metadata = ours[1]
        chunks = [len(md.chunks) for md in metadata.state_dict_metadata.values()]
        assert sum(c for c in chunks if c == n) == sharded * n
        assert chunks.count(1) == len(tensors) - sharded  # the 0-d steps, saved once
        assert sum(len(p.items) for p in ours[0]) == sharded * n + len(tensors) - sharded


def _moved(plans: list, key: str, rank: int, change) -> list:
    """`plans` with the chunk of `key` on `rank` changed by `change(chunk)`."""
    plans = list(plans)
    items = []
    for item in plans[rank].items:
        if item.index.fqn == key:
            chunk = change(item.tensor_data.chunk)
            data = dataclasses.replace(item.tensor_data, chunk=chunk)
            index = dataclasses.replace(item.index, offset=chunk.offsets)
            item = dataclasses.replace(item, index=index, tensor_data=data)
        items.append(item)
    plans[rank] = dataclasses.replace(plans[rank], items=items)
    return plans


def _chunk(offsets: tuple, sizes: tuple) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))


@pytest.mark.parametrize(
    "change",
    [
        # rank 3's rows start one row early: it overlaps rank 2 and leaves its last row out
        lambda c: _chunk((c.offsets[0] - 1, 0), c.sizes),
        # one row late: it overlaps rank 4 and leaves a row of rank 2's end uncovered
        lambda c: _chunk((c.offsets[0] + 1, 0), c.sizes),
        # past the end of the tensor
        lambda c: _chunk((c.offsets[0] + 40, 0), c.sizes),
        # one row short: the chunks do not fill the tensor
        lambda c: _chunk(c.offsets, (c.sizes[0] - 1, c.sizes[1])),
        # split along both dimensions (torch's own validation): half the columns missing
        lambda c: _chunk(c.offsets, (c.sizes[0], c.sizes[1] // 2)),
        # two-dimensional and overlapping another rank's block
        lambda c: _chunk((c.offsets[0] - 1, 1), (c.sizes[0], c.sizes[1] - 1)),
    ],
)
def test_refuses_what_torch_refuses(change):
    plans = scale_plans.fsdp2_save_plans(SMALL, 8, prefix="model")
    bad = _moved(plans, "model.model.layers.0.mlp.down_proj.weight", 3, change)
    with pytest.raises(ValueError, match="Failed to validate global plan"):
        DefaultSavePlanner().create_global_plan(bad)
    with pytest.raises(ValueError, match="Failed to validate global plan"):
        SavePlanner().create_global_plan(bad)


def test_two_dimensional_blocks_are_validated_by_torch():
    """A key split along two dimensions (2 x 2 blocks) is valid for both planners."""
    plans = scale_plans.fsdp2_save_plans(SMALL[:1], 4, prefix="model")
    rows, cols = SMALL[0][1]
    blocks = [((r, c), (rows // 2, cols // 2)) for r in (0, rows // 2) for c in (0, cols // 2)]
    for rank, (offsets, sizes) in enumerate(blocks):
        plans = _moved(plans, plans[0].items[0].index.fqn, rank, lambda c, o=offsets,
                       s=sizes: _chunk(o, s))  # fmt: skip
    ours, theirs = SavePlanner(), DefaultSavePlanner()
    assert ours.create_global_plan(plans) == theirs.create_global_plan(plans)


@pytest.mark.parametrize(("saved", "now"), [(64, 64), (64, 48), (8, 64), (64, 1)])
def test_read_items_are_torchs(saved, now):
    """Each resuming rank's reads equal torch's (same world, resharded, one process)."""
    plans = scale_plans.fsdp2_save_plans(SMALL, saved)
    _, metadata = SavePlanner().create_global_plan(plans)
    for rank in sorted({0, 1, now // 2, 47, now - 1} & set(range(now))):
        for key, chunks in scale_plans.local_chunks(SMALL, now, rank).items():
            md = metadata.state_dict_metadata[key]
            theirs = create_read_items_for_chunk_list(key, md, chunks)
            ours = _read_items_in_order(key, md, chunks)
            assert ours == theirs, (key, rank)


def test_local_load_plan_is_torchs(fake_world, tmp_path):
    """Over real DTensors: accel's planner on the whole metadata, and accel's planner on what
    IndexedReader reads of the chunk index, both plan torch's reads."""
    global_plan, metadata = SavePlanner().create_global_plan(
        scale_plans.fsdp2_save_plans(SMALL, 64)
    )
    metadata.storage_data = scale_plans.storage_of(global_plan, 4)
    write_index(tmp_path, metadata, metadata.storage_data, fsync=False)
    for rank in (0, 47, 63):
        fake_world(64, rank)
        state = {"model": dtensor_state(SMALL, 64, rank)}
        theirs = DefaultLoadPlanner()
        theirs.set_up_planner(state, metadata)
        expected = theirs.create_local_plan().items
        ours = LoadPlanner()
        ours.set_up_planner(state, metadata)
        assert ours.create_local_plan().items == expected
        indexed = LoadPlanner()
        indexed.set_up_planner(state, IndexedReader(tmp_path, state).read_metadata())
        assert indexed.create_local_plan().items == expected


@pytest.mark.parametrize(("saved", "now"), [(64, 64), (64, 48), (8, 64), (64, 1)])
def test_chunk_index_gives_each_rank_torchs_reads(tmp_path, saved, now):
    """Through accel's chunk index a resuming rank gets the Metadata of its own chunks only,
    and from it the planner makes exactly the reads (and storage entries) torch's makes from
    the whole .metadata; on the same world that is one chunk per key it holds rows of."""
    tensors = SMALL + scale_plans.optimizer_tensors(SMALL)[:3]  # a 0-d step kept whole
    global_plan, metadata = SavePlanner().create_global_plan(
        scale_plans.fsdp2_save_plans(tensors, saved)
    )
    storage = scale_plans.storage_of(global_plan, 4)
    metadata.storage_data = storage
    write_index(tmp_path, metadata, storage, fsync=False)
    for rank in sorted({0, 1, now // 2, 47, now - 1} & set(range(now))):
        mine = scale_plans.local_chunks(tensors, now, rank)
        wanted = {k: (None if not v[0].sizes else v) for k, v in mine.items()}
        partial = read_index(tmp_path / DCP_INDEX, wanted)
        assert set(partial.state_dict_metadata) == set(mine)
        for key, chunks in mine.items():
            full_md = metadata.state_dict_metadata[key]
            theirs = create_read_items_for_chunk_list(key, full_md, chunks)
            ours = _read_items_in_order(key, partial.state_dict_metadata[key], chunks)
            if ours is None:  # the 0-d step: one chunk, kept whole
                ours = create_read_items_for_chunk_list(
                    key, partial.state_dict_metadata[key], chunks
                )
            assert ours == theirs, (key, rank)
            for item in ours:
                assert partial.storage_data[item.storage_index] == storage[item.storage_index]
        if saved == now:
            held = sum(1 for v in mine.values() if not v[0].sizes or v[0].sizes[0] > 0)
            got = sum(len(md.chunks) for md in partial.state_dict_metadata.values())
            assert got == held


def test_checkpoint_file_counts():
    """Files per checkpoint: linear in N, a constant number per rank."""
    for n in (8, 64):
        assert len(scale_plans.ddp_files(n)) == 3 + 2 * n
        assert len(scale_plans.zero_files(n, 3)) == 2 * n
        assert len(scale_plans.zero_files(n, 2)) == 1 + n


# -- real files, two gloo processes ---------------------------------------------------------
def _save_sharded(root: str) -> None:
    """Save the state 2-way sharded into root/accel (accel's planner), root/torch (torch's)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo")
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        state = {
            name: distribute_tensor(value, mesh, [Shard(0)])
            for name, value in expected_state().items()
        }
        accel = IndexedWriter(os.path.join(root, "accel"))
        dcp.save({"model": state}, storage_writer=accel, planner=SavePlanner())
        torch_path = os.path.join(root, "torch")
        dcp.save({"model": state}, checkpoint_id=torch_path, planner=DefaultSavePlanner())
    finally:
        dist.destroy_process_group()


def expected_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=g) for name, shape in SMALL[:6]}


def test_saved_by_accel_loads_with_torch_and_back(tmp_path):
    """Two processes save 2-way sharded tensors, once as accel does (its planner and chunk
    index), once as torch does; one process loads accel's with torch's stock loader and
    torch's with accel's planner and reader, and accel's through its index (2 chunks per key
    read into whole tensors)."""
    run_distributed(_save_sharded, str(tmp_path), world_size=2, timeout=120)
    assert (tmp_path / "accel" / DCP_INDEX).is_file()
    assert not (tmp_path / "torch" / DCP_INDEX).exists()
    for planner, folder in (("torch", "accel"), ("accel", "torch"), ("accel", "accel")):
        folder = str(tmp_path / folder)
        state = {"model": {k: torch.zeros_like(v) for k, v in expected_state().items()}}
        if planner == "torch":
            dcp.load(state, checkpoint_id=folder, no_dist=True)
        else:
            reader = IndexedReader(folder, state)
            dcp.load(state, storage_reader=reader, planner=LoadPlanner(), no_dist=True)
        for name, value in expected_state().items():
            assert torch.equal(state["model"][name], value), (planner, name)
        with open(os.path.join(folder, ".metadata"), "rb") as f:
            metadata = pickle.load(f)
        assert all(len(md.chunks) == 2 for md in metadata.state_dict_metadata.values())
