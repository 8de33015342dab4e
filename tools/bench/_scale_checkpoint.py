"""Checkpoint planning and commit, the data position, step metrics and estimate-memory at N
ranks, by simulation (the checkpoint paths of tools/bench/bench_scale.py).

FSDP2 (a Llama-3-8B's 291 tensors, Shard(0) over N; `accel_testkit.scale_plans` builds every
rank's DCP SavePlan from the sharding arithmetic, item for item what torch's
create_default_local_save_plan makes of DTensors):

- `save_fsdp2_dcp`: coordinator_s is accel's planner (accel_parallel.checkpoint's
  SavePlanner) making the global plan and metadata of all N plans, then writing accel's chunk
  index; per_rank_s one rank's real local plan (torch's planner over 291 real DTensors of a
  DeviceMesh on a fake process group of N); bytes the pickled .metadata and the index the
  coordinator writes (the model's folder); files those of the whole
  checkpoint (model and optimizer folders: WRITE_THREADS files per rank each, the RNG and
  accel process file per rank, the shared files and the marker).
- `save_fsdp2_dcp_torch`: torch's DefaultSavePlanner on the same plans (its global plan and
  metadata are compared with accel's: they must be equal).
- `load_fsdp2_dcp`: per_rank_s one rank's resume planning over real DTensors: reading its
  chunks through accel's chunk index (`IndexedReader`, from a real folder) and accel's
  LoadPlanner's local plan; bytes what the rank reads of the index (its header and the rows
  it bisects). `load_fsdp2_dcp_torch`: the same with torch's reader and planner (the whole
  .metadata read and unpickled by every rank).
- `save_ddp`, `save_zero`: the files of a checkpoint and accel's marker: the real
  `finalize` over a folder of empty files with the checkpoint's names (coordinator_s, bytes
  of the marker), ZeRO-3 with DeepSpeed's naming rule.
- `data_position`: the real accel-data loader state a rank saves for the exact data position
  (a prepared loader, rank 0 of N), its bytes, the files (one per rank) and the conversion on
  resume (`continue_data_position`).
- `step_metrics`: the collectives per logged step that the step metrics add (a real
  Accelerator with log_step_metrics over a fake process group of N: calls with and without).
- `estimate_memory`: the real `accel estimate-memory` command (accel_cli.main) for a
  Llama-3-8B config.json at --num_processes N.
- `estimate_memory_train`: the same with `--train` (every engine's row: FSDP2 traced over a fake
  process group of N, each parameter's shard made alone; DDP and ZeRO by their rules): its
  wall time, and FSDP2's peak in the note.

- `save_fsdp2_dcp_optimizer`: the optimizer's folder (Adam's two moments per parameter, a
  0-d step each): accel's coordinator, torch's DefaultSavePlanner in the note.

    uv run python tools/bench/bench_scale.py --paths save_fsdp2_dcp ...  # 8 to 512 for FSDP2
    ACCEL_SCALE_FULL=1 uv run python tools/bench/bench_scale.py --ns 2816 --paths \
        save_fsdp2_dcp save_fsdp2_dcp_torch save_fsdp2_dcp_optimizer load_fsdp2_dcp \
        load_fsdp2_dcp_torch                      # the 2,816-rank figures (minutes)
    ACCEL_SCALE_FULL=1 uv run python tools/bench/bench_scale.py --ns 4096 16384 --paths \
        save_fsdp2_dcp load_fsdp2_dcp             # past the default limits
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import json
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from accel_testkit import scale_plans

MODEL = scale_plans.llama_tensors()
_PLANS: dict[int, tuple[list, Any]] = {}  # n -> (local plans, accel's (global plan, metadata))


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of `fn()`, the objects alive before it frozen out of the garbage
    collector's scans: the millions of plan items built for the simulation would otherwise be
    scanned again at each collection that `fn`'s allocations trigger, a cost that depends on
    what ran before, not on the code measured."""
    gc.collect()
    gc.freeze()
    try:
        start = time.perf_counter()
        out = fn()
        return time.perf_counter() - start, out
    finally:
        gc.unfreeze()


def _write_threads() -> int:
    from accel_parallel._io import WRITE_THREADS

    return WRITE_THREADS


def _with_storage(global_plan: list, metadata: Any) -> Any:
    """A copy of the metadata as FileSystemWriter writes it: storage_data gives each item its
    file (``__<rank>_<i>.distcp``), offset and length."""
    storage = scale_plans.storage_of(global_plan, _write_threads())
    return dataclasses.replace(metadata, storage_data=storage)


@contextlib.contextmanager
def _fake_world(n: int, rank: int = 0):
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401 (registers "fake")

    try:
        from torch._C._distributed_c10d import FakeStore
    except ImportError:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=n)
    try:
        yield
    finally:
        if dist.is_initialized():  # end_training may have destroyed it
            dist.destroy_process_group()


def _dtensor_state(n: int, rank: int) -> dict[str, Any]:
    """{"model": 291 DTensors}: `rank`'s shards on a DeviceMesh of `n` (a fake group), their
    local tensors empty CPU tensors (never touched)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (n,))
    state = {}
    for name, shape in MODEL:
        local, _ = scale_plans.fsdp2_chunk(shape, n, rank)
        t = torch.empty(local, dtype=torch.bfloat16)
        stride = tuple(scale_plans._strides(shape))
        state[name] = DTensor.from_local(
            t, mesh, [Shard(0)], shape=torch.Size(shape), stride=stride, run_check=False
        )
    return {"model": state}


def _plans(n: int, kind: str = "model") -> tuple[list, Any]:
    """(every rank's local plan, accel's (global plan, metadata) once made) of the model's or
    the optimizer's folder at world size `n` (the last one built is kept)."""
    if (n, kind) not in _PLANS:
        _PLANS.clear()
        tensors = MODEL if kind == "model" else scale_plans.optimizer_tensors(MODEL)
        _PLANS[n, kind] = (scale_plans.fsdp2_save_plans(tensors, n, prefix=kind), None)
    return _PLANS[n, kind]


def _coordinate(n: int, kind: str) -> tuple[float, int, Any]:
    """accel's coordinator on `kind`'s folder: its global plan and metadata, then its chunk
    index written (seconds, bytes of .metadata and index, the global plan and metadata)."""
    from accel_parallel.checkpoint import DCP_INDEX, SavePlanner
    from accel_parallel.checkpoint._index import write_index

    plans, _ = _plans(n, kind)
    seconds, planned = _timed(lambda: SavePlanner().create_global_plan(plans))
    _PLANS[n, kind] = (plans, planned)
    metadata = _with_storage(*planned)
    with tempfile.TemporaryDirectory() as folder:
        index_s, _ = _timed(
            lambda: write_index(Path(folder), metadata, metadata.storage_data, fsync=False)
        )
        size = len(pickle.dumps(metadata)) + (Path(folder) / DCP_INDEX).stat().st_size
    return seconds + index_s, size, planned


def save_fsdp2_dcp(n: int) -> dict[str, Any]:
    from torch.distributed.checkpoint import DefaultSavePlanner

    seconds, size, _ = _coordinate(n, "model")
    with _fake_world(n, rank=n - 1):
        state = _dtensor_state(n, n - 1)
        planner = DefaultSavePlanner()
        per_rank, _ = _timed(lambda: (planner.set_up_planner(state), planner.create_local_plan()))
    rng_and_process, shared, marker = 2, 3, 1
    folders = 2 * (n * _write_threads() + 2)  # model and optimizer: shards, .metadata, index
    files = folders + n * rng_and_process + shared + marker
    return {
        "coordinator_s": seconds,
        "per_rank_s": per_rank,
        "bytes": size,
        "files": files,
        "note": f"model .metadata + index {size / n:.0f} B per rank; {files / n:.2f} files per "
        f"rank (model and optimizer folders, RNG and process files)",
    }


def save_fsdp2_dcp_torch(n: int) -> dict[str, Any]:
    from torch.distributed.checkpoint import DefaultSavePlanner

    plans, ours = _plans(n)
    if ours is None:
        ours = _coordinate(n, "model")[2]
    seconds, theirs = _timed(lambda: DefaultSavePlanner().create_global_plan(plans))
    same = theirs == ours
    return {"coordinator_s": seconds, "note": f"torch {torch.__version__}; same global plan "
            f"and metadata as accel's: {same}"}  # fmt: skip


def save_fsdp2_dcp_optimizer(n: int) -> dict[str, Any]:
    """The optimizer folder (Adam: 2 x 291 sharded moments, 291 0-d steps): accel's
    coordinator, torch's DefaultSavePlanner's in the note."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    seconds, size, ours = _coordinate(n, "optimizer")
    plans, _ = _plans(n, "optimizer")
    torch_s, theirs = _timed(lambda: DefaultSavePlanner().create_global_plan(plans))
    return {
        "coordinator_s": seconds,
        "bytes": size,
        "note": f"torch's DefaultSavePlanner {torch_s:.2f} s (same plan: {theirs == ours})",
    }


def _resume(n: int, accel: bool) -> dict[str, Any]:
    """One rank's resume planning (rank n // 2) from a folder holding the .metadata and, for
    accel, its chunk index: the metadata read, then the local plan over real DTensors."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    from accel_parallel.checkpoint import DCP_INDEX, LoadPlanner
    from accel_parallel.checkpoint import _index as index

    _, planned = _plans(n)
    if planned is None:
        planned = _coordinate(n, "model")[2]
    metadata = _with_storage(*planned)
    rows_read = [0]
    values = index._Rows._values

    def counted(self: Any, i: int) -> tuple:
        rows_read[0] += 1
        return values(self, i)

    with tempfile.TemporaryDirectory() as folder, _fake_world(n, rank=n // 2):
        (Path(folder) / ".metadata").write_bytes(pickle.dumps(metadata))
        index.write_index(Path(folder), metadata, metadata.storage_data, fsync=False)
        state = _dtensor_state(n, n // 2)
        if accel:
            index._Rows._values = counted
            try:
                reader = index.IndexedReader(folder, state)
                read_s, partial = _timed(reader.read_metadata)
            finally:
                index._Rows._values = values
            planner = LoadPlanner()
        else:
            reader = torch.distributed.checkpoint.FileSystemReader(folder)
            read_s, partial = _timed(reader.read_metadata)
            planner = DefaultLoadPlanner()
        planner.set_up_planner(state, partial)
        plan_s, plan = _timed(planner.create_local_plan)
        header = (Path(folder) / DCP_INDEX).read_bytes()[:16]
        whole = (Path(folder) / ".metadata").stat().st_size
    row_bytes = 2 * 2 * 8 + 16 + 16  # 2-D rows: offsets, sizes, offset, length, ~16 B name
    header_bytes = int.from_bytes(header[8:16], "little") + 16
    read = header_bytes + rows_read[0] * row_bytes if accel else whole
    return {
        "coordinator_s": 0.0,
        "per_rank_s": read_s + plan_s,
        "bytes": read,
        "note": f"per rank: metadata read {read_s:.4f} s + local plan {plan_s:.4f} s, "
        f"{len(plan.items)} reads; " + (f"{rows_read[0]} index rows read" if accel else
        f"the whole .metadata ({whole / 1e6:.1f} MB)"),
    }  # fmt: skip


def load_fsdp2_dcp(n: int) -> dict[str, Any]:
    return _resume(n, accel=True)


def load_fsdp2_dcp_torch(n: int) -> dict[str, Any]:
    return _resume(n, accel=False)


def _commit(names: list[str], meta: dict[str, Any]) -> dict[str, Any]:
    """The real finalize over empty files named `names`: seconds, marker bytes, files."""
    from accel._checkpoint._commit import finalize

    with tempfile.TemporaryDirectory() as root:
        tmp, target = Path(root) / ".ckpt.incomplete", Path(root) / "ckpt"
        tmp.mkdir()
        for name in names:
            (tmp / name).parent.mkdir(exist_ok=True)
            (tmp / name).touch()
        seconds, _ = _timed(lambda: finalize(tmp, target, meta, None, fsync=False))
        marker = (target / "accel_checkpoint.json").stat().st_size
        files = sum(1 for p in target.rglob("*") if p.is_file())
    return {"coordinator_s": seconds, "bytes": marker, "files": files}


def save_ddp(n: int) -> dict[str, Any]:
    out = _commit(scale_plans.ddp_files(n), {"format": 2, "num_processes": n})
    out["note"] = f"marker {out['bytes'] / n:.1f} B per rank (written once, by the owner)"
    return out


def save_zero(n: int) -> dict[str, Any]:
    names = scale_plans.zero_files(n, stage=3) + scale_plans.ddp_files(n)[3:]
    names += ["latest", "zero_to_fp32.py", "scheduler.bin"]  # DeepSpeed's, accelerate's
    out = _commit(names, {"format": 2, "num_processes": n})
    params = 8_030_261_248
    out["note"] = (
        f"ZeRO-3: {out['files'] / n:.2f} files per rank; optimizer partition "
        f"{params * 12 / n / 2**20:.0f} MiB per rank (fp32 master + 2 moments)"
    )
    return out


def data_position(n: int) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from accel_data import continue_data_position, prepare_data_loader

    loader = DataLoader(list(range(64 * n)), batch_size=4)
    shard = prepare_data_loader(loader, num_processes=n, process_index=n - 1)
    it = iter(shard)
    for _ in range(3):
        next(it)
    state = shard.state_dict()
    buffer = io.BytesIO()
    save_s, _ = _timed(lambda: torch.save({"dataloaders": [state]}, buffer))
    total = getattr(shard, "total_batch_size", None)
    load_s, _ = _timed(lambda: continue_data_position(state, total, total, n))
    return {
        "per_rank_s": save_s + load_s,
        "bytes": buffer.tell(),
        "files": n,
        "note": "bytes: one rank's accel_process file part for one loader; files: one per rank",
    }


_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "gather",
                "scatter", "reduce_scatter_tensor", "barrier", "all_gather_object",
                "broadcast_object_list", "gather_object", "all_to_all_single")  # fmt: skip


@contextlib.contextmanager
def _counted(counts: dict[str, int]):
    import torch.distributed as dist

    saved = {name: getattr(dist, name) for name in _COLLECTIVES}

    def wrap(name: str, fn: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)

        return call

    for name, fn in saved.items():
        setattr(dist, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _kept(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks real annotations
    """A DDP communication hook that keeps the local gradients (the same with and without the
    step metrics)."""
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _steps(n: int, on: bool, steps: int = 4) -> dict[str, int]:
    import os

    from torch.utils.data import DataLoader, TensorDataset

    from accel import Accelerator, StepMetricsKwargs
    from accel.state import AcceleratorState

    env = {"RANK": "0", "WORLD_SIZE": str(n), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}  # fmt: skip
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    counts: dict[str, int] = {}
    try:
        with _fake_world(n):
            handlers = [StepMetricsKwargs(print_every=1, log_every=1)] if on else []
            acc = Accelerator(cpu=True, kwargs_handlers=handlers)
            model = torch.nn.Linear(8, 1)
            data = TensorDataset(torch.randn(4 * n * steps, 8), torch.randn(4 * n * steps, 1))
            model, opt, loader = acc.prepare(model, torch.optim.SGD(model.parameters(), 0.1),
                                             DataLoader(data, batch_size=4))  # fmt: skip
            if hasattr(model, "register_comm_hook"):  # a fake group's all-reduce has no result
                model.register_comm_hook(None, _kept)
            with _counted(counts), contextlib.redirect_stdout(io.StringIO()):
                for x, y in loader:
                    acc.backward(torch.nn.functional.mse_loss(model(x), y))
                    opt.step()
                    opt.zero_grad()
                    _ = acc.step_metrics if on else None
            acc.end_training()
    finally:
        AcceleratorState._reset_state()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return counts


def step_metrics(n: int) -> dict[str, Any]:
    on, off = _steps(n, True), _steps(n, False)
    added = {k: on.get(k, 0) - off.get(k, 0) for k in set(on) | set(off)}
    extra = sum(added.values())
    return {
        "probes": extra,
        "bytes": 0 if extra == 0 else None,
        "note": f"collectives added by the step metrics over 4 logged steps: {extra} "
        f"(with: {sum(on.values())}, without: {sum(off.values())})",
    }


LLAMA3_8B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
             "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "max_position_embeddings": 8192, "tie_word_embeddings": False}  # fmt: skip


def estimate_memory(n: int) -> dict[str, Any]:
    from accel_cli.main import main

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(LLAMA3_8B))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            seconds, code = _timed(
                lambda: main(["estimate-memory", folder, "--num_processes", str(n), "--json"])
            )
    report = json.loads(out.getvalue())
    fsdp2 = report["per_process"]["bfloat16"]["FSDP2"]
    return {
        "coordinator_s": seconds,
        "note": f"exit {code}; FSDP2 bf16 {fsdp2 / 2**30:.2f} GiB per process",
    }


def estimate_memory_train(n: int) -> dict[str, Any]:
    from accel_cli.main import main

    argv = ["estimate-memory", "", "--train", "--num_processes", str(n), "--json"]
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(LLAMA3_8B))
        argv[1] = folder
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            seconds, code = _timed(lambda: main(argv))
    rows = json.loads(out.getvalue())
    fsdp2 = next(r for r in rows if r["engine"] == "fsdp2" and not r["offload"])
    return {
        "coordinator_s": seconds,
        "note": f"exit {code}; {len(rows)} rows; FSDP2 fp32 AdamW batch 1 "
        f"{fsdp2['peak_bytes'] / 2**30:.2f} GiB per process ({fsdp2['method']})",
    }


PATHS: dict[str, Callable[[int], dict[str, Any]]] = {
    "save_fsdp2_dcp": save_fsdp2_dcp,
    "save_fsdp2_dcp_torch": save_fsdp2_dcp_torch,
    "save_fsdp2_dcp_optimizer": save_fsdp2_dcp_optimizer,
    "load_fsdp2_dcp": load_fsdp2_dcp,
    "load_fsdp2_dcp_torch": load_fsdp2_dcp_torch,
    "save_ddp": save_ddp,
    "save_zero": save_zero,
    "data_position": data_position,
    "step_metrics": step_metrics,
    "estimate_memory": estimate_memory,
    "estimate_memory_train": estimate_memory_train,
}
# The default sweep stays within ~3 minutes here: the FSDP2 paths stop at 512 (building and
# planning 4096 x 291 items takes minutes; torch's quadratic validation more). With
# ACCEL_SCALE_FULL=1 every path runs at every N given (`--ns 2816`, `--ns 4096 16384`).
_FULL = os.environ.get("ACCEL_SCALE_FULL") == "1"
LIMITS: dict[str, int] = (
    {}
    if _FULL
    else {
        "save_fsdp2_dcp": 512,
        "load_fsdp2_dcp": 512,
        "load_fsdp2_dcp_torch": 512,
        "save_fsdp2_dcp_torch": 512,
        "save_fsdp2_dcp_optimizer": 512,
        "step_metrics": 512,
    }
)

if __name__ == "__main__":
    sys.exit("run tools/bench/bench_scale.py --paths " + " ".join(PATHS))
