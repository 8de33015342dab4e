"""The readers behind `load_checkpoint_in_model(reader=...)`, each feeding a `Placer`.

- accel: every safetensors shard's header is parsed first. Tensors kept in host memory in their
  stored dtype view a private map of their shard, cold shards faulted in by threads in the
  model's order (`_fault_in.FaultIn`); the rest are sorted into the model's order and read
  concurrently into new tensors (`_pread.stream_tensors`).
- mmap: safetensors' ``safe_open``, one tensor at a time (the memory map's page faults).
- torch: ``.bin`` / ``.pt`` files through ``torch.load(weights_only=True)``.
- runai / fastsafetensors: the optional streamers, imported when asked for.
"""

from __future__ import annotations

import mmap
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import torch

from accel_bigmodel._device_kinds import copies_on_side_streams, is_host
from accel_bigmodel._fault_in import FaultIn, is_cached, map_file, mapped_tensor
from accel_bigmodel._header import TensorInfo, UnsupportedDtype, read_header
from accel_bigmodel._offload import dtype_name, safetensors_entries
from accel_bigmodel._placer import Placer, Plan
from accel_bigmodel._pread import ReadRequest, stream_tensors
from accel_bigmodel._progress import Progress
from accel_bigmodel._reader import CheckpointReader

_INSTALL = {"runai": "runai-model-streamer", "fastsafetensors": "fastsafetensors"}


def corrupt(path: str, error: BaseException) -> ValueError:
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return ValueError(
        f"Cannot read the checkpoint shard {path} ({type(error).__name__}: {first}). The file is "
        f"corrupt or truncated; save or download it again."
    )


def _entry(info: TensorInfo) -> dict:
    return {
        "dtype": dtype_name(info.dtype),
        "shape": list(info.shape),
        "file": os.path.abspath(info.path),
        "offset": info.offset,
    }


def _read_device(device: object) -> torch.device:
    """Where the reader puts a tensor for `device`: the GPU itself, else host memory."""
    if isinstance(device, int):
        return torch.device("cuda", device)
    if isinstance(device, torch.device) and copies_on_side_streams(device):
        return device
    if isinstance(device, str) and device.startswith("cuda"):
        return torch.device(device)
    return torch.device("cpu")


def plan_file(placer: Placer, infos: list[TensorInfo]) -> list[tuple[TensorInfo, Plan]]:
    """The tensors of one file that must be read, with their plans (in-place disk ones are not)."""
    todo = []
    for info in infos:
        plan = placer.plan(info.name)
        if plan is None or placer.keep_in_place(info.name, plan, _entry(info)):
            continue
        todo.append((info, plan))
    return todo


def load_accel(
    placer: Placer, paths: list[str], reader: CheckpointReader, progress: Progress
) -> list[str]:
    """Read `paths` with the concurrent reader; return the files it leaves to the mmap reader.

    Tensors that stay in host memory in their stored dtype view a private map of their shard
    (no copy, as safetensors' own loader); shards not in the page cache are brought in by
    `FaultIn` threads in the model's order, and with `reader.overlap` the load returns while
    they run: each module's forward first waits for its own tensors. The other tensors (a
    dtype change, a GPU) are read into new tensors by `stream_tensors`.
    """
    work: list[tuple[TensorInfo, Plan]] = []
    left: list[str] = []
    maps: dict[str, mmap.mmap | None] = {}
    cached: dict[str, bool] = {}
    if reader.map_cached:  # the page-cache checks of all shards at once (mincore drops the GIL)
        maps = {path: map_file(path) for path in paths}
        with ThreadPoolExecutor(min(len(paths), reader.resolved_threads)) as pool:
            live = [p for p in paths if maps[p] is not None]
            cached = dict(zip(live, pool.map(lambda p: is_cached(maps[p]), live)))
        placer.cached_files.update(path for path, warm in cached.items() if warm)
    views: list[tuple[TensorInfo, Plan, torch.Tensor]] = []
    for path in paths:
        try:
            infos = read_header(path)
        except UnsupportedDtype:
            if reader.backend != "auto":
                raise
            left.append(path)
            continue
        todo = plan_file(placer, infos)
        if todo and maps.get(path) is not None:
            todo = _split_mapped(placer, maps[path], todo, views)
        work.extend(todo)
        if not todo:
            progress.update()
    views.sort(key=lambda item: item[1].position)
    for info, plan, view in views:
        placer.put(info.name, plan, view)
    cold = [(i, p) for i, p, _ in views if not cached.get(i.path)]
    fault_in = None
    if cold:
        items = [(i.path, maps[i.path], i.offset, i.nbytes) for i, _ in cold]
        fault_in = FaultIn(items, reader.threads)  # None: the shape measured here
    work.sort(key=lambda item: item[1].position)
    remaining = Counter(info.path for info, _ in work)
    requests = [
        ReadRequest(info, placer.final_dtype(plan, info.dtype), _read_device(plan.device))
        for info, plan in work
    ]
    plans = iter(work)
    stream = stream_tensors(requests, reader.resolved_threads, reader.resolved_buffer_size)
    for request, tensor in stream:
        info, plan = next(plans)
        assert info is request.info
        placer.put(info.name, plan, tensor)
        remaining[info.path] -= 1
        if not remaining[info.path]:
            progress.update()
    if fault_in is not None:
        if reader.overlap:
            wait_in_forward(placer.model, [plan.target for _, plan in cold], fault_in)
        else:
            fault_in.join()
    return left


def _split_mapped(
    placer: Placer,
    mapped: mmap.mmap,
    todo: list[tuple[TensorInfo, Plan]],
    views: list[tuple[TensorInfo, Plan, torch.Tensor]],
) -> list[tuple[TensorInfo, Plan]]:
    """Add to `views` what a mapped shard can serve as views of its map; return the rest."""
    rest = []
    for info, plan in todo:
        same = placer.final_dtype(plan, info.dtype) == info.dtype
        on_host = is_host(_read_device(plan.device))
        view = mapped_tensor(mapped, info) if same and on_host and plan.target else None
        if view is None:
            rest.append((info, plan))
        else:
            views.append((info, plan, view))
    return rest


def wait_in_forward(model: torch.nn.Module, targets: list[str | None], fault_in: FaultIn) -> None:
    """Make each module that owns one of `targets` (item i of `fault_in`) wait for its items.

    A forward pre-hook per module waits only for that module's own tensors, then removes
    itself; the hooks are removed too once every item is in.
    """
    owners: dict[str, list[int]] = {}
    for i, name in enumerate(targets):
        if name is not None:
            owners.setdefault(name.rpartition(".")[0], []).append(i)
    modules = dict(model.named_modules())
    handles = [
        _wait_for(modules[prefix], items, fault_in)
        for prefix, items in owners.items()
        if prefix in modules
    ]
    fault_in.on_finish(lambda: [h.remove() for h in handles])


def _wait_for(module: torch.nn.Module, items: list[int], fault_in: FaultIn) -> object:
    hook = _WaitForOwn(items, fault_in)
    hook.handle = module.register_forward_pre_hook(hook)
    return hook.handle


class _WaitForOwn:
    """A forward pre-hook: wait for the module's own tensors once, then remove itself.

    A copy of the model made meanwhile (`copy.deepcopy`, pickling) gets a hook that does
    nothing: the mapped tensors are valid all along, the wait only orders the reads.
    """

    def __init__(self, items: list[int], fault_in: FaultIn) -> None:
        self.items, self.fault_in, self.handle = items, fault_in, None

    def __call__(self, _module: torch.nn.Module, _args: object) -> None:
        for i in self.items:
            self.fault_in.wait(i)
        if self.handle is not None:
            self.handle.remove()

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (_NoWait, ())


class _NoWait:
    """What a copied `_WaitForOwn` becomes: a pre-hook that leaves the call alone."""

    def __call__(self, _module: torch.nn.Module, _args: object) -> None:
        return None


def _safetensors_items(path: str) -> Iterator[tuple[str, Callable[[], torch.Tensor], dict]]:
    from safetensors import safe_open

    try:
        entries = safetensors_entries(path)  # a bad header: a ValueError naming file and byte
    except OSError as e:
        raise corrupt(path, e) from e
    try:
        handle = safe_open(path, framework="pt", device="cpu")
    except Exception as e:
        raise corrupt(path, e) from e
    with handle as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)

            def read(name: str = name) -> torch.Tensor:
                try:
                    return f.get_tensor(name)
                except Exception as e:
                    raise corrupt(path, e) from e

            yield name, read, entries.get(name)


def _torch_items(path: str) -> Iterator[tuple[str, Callable[[], torch.Tensor], None]]:
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e) and "zip" not in str(e):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise corrupt(path, e) from e
    if not isinstance(state, Mapping):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a state dict of tensors.")
    for name in list(state):
        tensor = state.pop(name)
        yield name, (lambda t=tensor: t), None


def load_one_by_one(placer: Placer, path: str) -> None:
    """Read `path` one tensor at a time: safetensors' memory map, or torch.load for .bin/.pt."""
    is_safetensors = path.endswith(".safetensors")
    items = _safetensors_items(path) if is_safetensors else _torch_items(path)
    for name, read, entry in items:
        plan = placer.plan(name)
        if plan is None or placer.keep_in_place(name, plan, entry):
            continue
        value = read()
        if not _owns_memory(value) and placer.final_dtype(plan, value.dtype) == value.dtype:
            value = value.clone()  # detach from the file's memory map
        placer.put(name, plan, value)


def _owns_memory(tensor: torch.Tensor) -> bool:
    """False for tensors backed by a memory-mapped file (torch.load(mmap=True))."""
    storage = tensor.untyped_storage()
    return storage.filename is None if hasattr(storage, "filename") else True


def _import(backend: str) -> object:
    try:
        if backend == "runai":
            import runai_model_streamer

            return runai_model_streamer
        import fastsafetensors

        return fastsafetensors
    except ImportError:
        raise ImportError(
            f"reader={backend!r} needs the {_INSTALL[backend]} package, which is not installed: "
            f"pip install {_INSTALL[backend]} (or use reader='auto')."
        ) from None


def _planned(placer: Placer, path: str) -> dict[str, Plan]:
    return {info.name: plan for info, plan in plan_file(placer, read_header(path))}


def load_runai(placer: Placer, paths: list[str], progress: Progress) -> None:
    """Stream `paths` with runai-model-streamer (its own threads and memory limit)."""
    module = _import("runai")
    plans: dict[str, Plan] = {}
    for path in paths:
        plans.update(_planned(placer, path))
    before = {k: v for k, v in os.environ.items() if k.startswith("RUNAI_STREAMER_")}
    try:
        if plans:
            with module.SafetensorsStreamer() as streamer:
                streamer.stream_files(paths, tensor_names=list(plans))
                for name, tensor in streamer.get_tensors():
                    placer.put(name, plans[name], tensor)
    finally:  # the streamer records its process-group size in the environment: undo that
        for key in [k for k in os.environ if k.startswith("RUNAI_STREAMER_")]:
            if key not in before:
                del os.environ[key]
        os.environ.update(before)
    progress.update(len(paths))


def load_fastsafetensors(
    placer: Placer, paths: list[str], reader: CheckpointReader, progress: Progress
) -> None:
    """Read each shard with fastsafetensors (one buffer per shard, host memory, no GDS)."""
    module = _import("fastsafetensors")
    for path in paths:
        plans = _planned(placer, path)
        if plans:
            loader = module.SafeTensorsFileLoader(
                None, "cpu", nogds=True, max_threads=reader.threads or 16
            )
            try:
                loader.add_filenames({0: [path]})
                files = loader.copy_files_to_device()
                try:
                    for name, plan in sorted(plans.items(), key=lambda kv: kv[1].position):
                        placer.put(name, plan, files.get_tensor(name))
                finally:
                    files.close()
            finally:
                loader.close()
        progress.update()
