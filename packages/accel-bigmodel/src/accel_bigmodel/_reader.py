"""How checkpoint shards are read: `CheckpointReader`, the backend and its knobs.

The readers themselves live beside it: `_header` (the safetensors header), `_fault_in` (maps
of cold shards faulted in by threads), `_pread` (concurrent reads into new tensors) and
`_read_ahead` (page-cache read-ahead for disk-offloaded tensors); `_sources` picks among them.
"""

from __future__ import annotations

from dataclasses import dataclass

from accel_bigmodel._sizes import convert_file_size_to_int

BACKENDS = ("auto", "accel", "mmap", "runai", "fastsafetensors")
DEFAULT_THREADS = 8
DEFAULT_BUFFER_SIZE = 256 * 2**20
_MIN_BUFFER = 2**20


@dataclass(frozen=True, kw_only=True)
class CheckpointReader:
    """How checkpoint shards are read: the backend and, for "accel", its threads and buffer.

    `backend`: "auto" (the default: "accel" for safetensors shards, torch.load for .bin/.pt),
    "accel" (see below), "mmap" (safetensors' memory map, one tensor at a time), "runai"
    (runai-model-streamer) or "fastsafetensors" (fastsafetensors); the last two must be
    installed. `threads`: reads at once (default: 8 for reads into new tensors; for faulting
    cold shards in, the shape measured on the machine, see `_read_shape`); `buffer_size`
    (bytes or "256MiB", the default) bounds the memory the reader holds beyond the model's own
    tensors.

    "accel" (and "auto") serve tensors that stay in host memory in their stored dtype as views
    of a private map of their shard, as safetensors' own loader does: no copy and no fresh
    memory. A shard not in the page cache is brought in by threads faulting large runs in, in
    the model's order. Tensors that change dtype or go to a GPU are read with
    large positional reads into new tensors (through staging buffers). `map_cached=False`
    reads every tensor into new memory instead of mapping. `overlap` (default True): the load
    returns while a cold shard is still coming in, and each module's forward first waits for
    its own tensors, so the first forward runs alongside the reading; False waits for all.
    """

    backend: str = "auto"
    threads: int | None = None
    buffer_size: int | str | None = None
    map_cached: bool = True
    overlap: bool = True

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(
                f"Unknown checkpoint reader {self.backend!r}; choose one of {list(BACKENDS)} "
                f'(e.g. reader="accel", or reader=CheckpointReader(backend="accel", threads=8)).'
            )
        threads = self.threads
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
            raise ValueError(f"CheckpointReader threads={threads!r} must be an int >= 1.")
        if threads is not None and threads < 1:
            raise ValueError(f"CheckpointReader threads={threads} must be >= 1 (e.g. 8).")
        if self.buffer_size is not None:
            size = convert_file_size_to_int(self.buffer_size)
            if size < _MIN_BUFFER:
                raise ValueError(
                    f"CheckpointReader buffer_size={self.buffer_size!r} is below 1MiB; give at "
                    f'least "1MiB" (the default is "256MiB").'
                )
        for flag in ("map_cached", "overlap"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"CheckpointReader {flag}={getattr(self, flag)!r} must be a bool.")
        honoured = {"mmap": (), "runai": (), "fastsafetensors": ("threads",)}
        if self.backend in honoured:
            tuned = [k for k in ("threads", "buffer_size") if getattr(self, k) is not None]
            tuned += [k for k in ("map_cached", "overlap") if not getattr(self, k)]
            ignored = [k for k in tuned if k not in honoured[self.backend]]
            if ignored:
                raise ValueError(
                    f"CheckpointReader(backend={self.backend!r}) cannot honour "
                    f"{', '.join(f'{k}={getattr(self, k)!r}' for k in ignored)}: these tune the "
                    f"'accel' reader (fastsafetensors takes threads only). Drop them or use "
                    f"backend='accel'."
                )

    @property
    def resolved_threads(self) -> int:
        return DEFAULT_THREADS if self.threads is None else self.threads

    @property
    def resolved_buffer_size(self) -> int:
        if self.buffer_size is None:
            return DEFAULT_BUFFER_SIZE
        return convert_file_size_to_int(self.buffer_size)


def as_reader(reader: str | CheckpointReader | None) -> CheckpointReader:
    """`reader` as a CheckpointReader: a backend name is shorthand for CheckpointReader(backend=)."""
    if reader is None:
        return CheckpointReader()
    if isinstance(reader, CheckpointReader):
        return reader
    if isinstance(reader, str):
        return CheckpointReader(backend=reader)
    raise ValueError(
        f"reader={reader!r} is neither a backend name nor a CheckpointReader; pass one of "
        f"{list(BACKENDS)} or CheckpointReader(backend=..., threads=..., buffer_size=...)."
    )
