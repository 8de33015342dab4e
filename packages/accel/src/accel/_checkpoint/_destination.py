"""Where one save_state goes: a local folder, or a prefix in an object store.

Both are written the same way by `_write` (into a local folder, `staging`) and completed the
same way by the Checkpointer; they differ in how the files reach their place and how the
checkpoint is marked complete:

- `LocalDestination`: a hidden temporary folder beside the target, renamed into place after
  accel's marker is written (`_commit.finalize`); byte for byte what accel always wrote.
- `StoreDestination`: a store has no rename. The owning process first writes a sentinel
  (``.accel_incomplete``) into the cleared prefix; every process writes its files into a
  private local folder and uploads them (no shared filesystem assumed: each process sends only
  what it wrote, a sharded engine its own shards); then the owner writes the marker, removes
  the sentinel and rotates. A prefix with a marker is complete; one with the sentinel and no
  marker is a save that was interrupted, named as such and never loaded.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from accel._checkpoint._commit import finalize
from accel._checkpoint._naming import remove_from_store, rotate, state_of
from accel_parallel.checkpoint import (
    MARKER,
    STORE_SENTINEL,
    process_file,
    rng_file,
    staging_path,
    written_flag,
)


class LocalDestination:
    """A checkpoint folder on this machine (`target`), staged in a temporary folder."""

    local = True

    def __init__(self, target: Path, automatic: bool) -> None:
        self.target = target
        self.staging = staging_path(target, automatic)
        self.uploaded_bytes = 0

    @property
    def name(self) -> str:
        return os.fspath(self.target)

    def prepare(self) -> None:
        """On the owning process, before anyone writes."""
        if self.staging.exists():
            shutil.rmtree(self.staging)
        self.staging.mkdir(parents=True)
        self.target.parent.mkdir(parents=True, exist_ok=True)

    def publish(self) -> None:
        """This process's files are where they belong once written."""

    def signal(self, rank: int, ok: bool = True) -> None:
        (self.staging / _flag(rank, ok)).write_text("")

    def written(self, ranks: list[int], ok: bool = True) -> list[int]:
        """The `ranks` whose files are written (an asynchronous save's flags); with
        `ok=False`, those whose writing failed."""
        return [r for r in ranks if (self.staging / _flag(r, ok)).exists()]

    def clear_signals(self, ranks: list[int]) -> None:
        for rank in ranks:
            (self.staging / written_flag(rank)).unlink()

    def finalize(self, meta: dict[str, Any], limit: int | None, fsync: bool) -> None:
        finalize(self.staging, self.target, meta, limit, fsync)

    def cleanup(self) -> None:
        """This process's part of the save is over (nothing to remove locally)."""


class StoreDestination:
    """A checkpoint prefix in an object store (`url`), each process's files staged in a
    private local folder and uploaded."""

    local = False

    def __init__(self, url: str, expected_bytes: int = 0, sharing: int = 1) -> None:
        self.url = url.rstrip("/")
        root = staging_root(expected_bytes, sharing)
        self.staging = Path(tempfile.mkdtemp(prefix="accel-upload-", dir=root))
        self.uploaded_bytes = 0

    @property
    def name(self) -> str:
        return self.url

    def prepare(self) -> None:
        """On the owning process: an older checkpoint of this name loses its marker first
        (it is no longer complete), then everything; the sentinel goes in before any file."""
        from accel_bigmodel import stores

        remove_from_store(self.url)
        stores.write_bytes(stores.join(self.url, STORE_SENTINEL), b"")

    def publish(self) -> None:
        from accel_bigmodel import stores

        self.uploaded_bytes = stores.upload(self.staging, self.url)

    def signal(self, rank: int, ok: bool = True) -> None:
        from accel_bigmodel import stores

        stores.write_bytes(stores.join(self.url, _flag(rank, ok)), b"")

    def written(self, ranks: list[int], ok: bool = True) -> list[int]:
        from accel_bigmodel import stores

        present = set(stores.list_names(self.url))
        return [r for r in ranks if _flag(r, ok) in present]

    def clear_signals(self, ranks: list[int]) -> None:
        from accel_bigmodel import stores

        for rank in ranks:
            stores.remove(stores.join(self.url, written_flag(rank)))

    def finalize(self, meta: dict[str, Any], limit: int | None, fsync: bool) -> None:
        """The marker (listing every file), then the sentinel removed, then the rotation."""
        from accel_bigmodel import stores

        names = [n for n in stores.list_names(self.url) if n != STORE_SENTINEL]
        meta = {**meta, "files": names}
        stores.write_bytes(stores.join(self.url, MARKER), json.dumps(meta, indent=1).encode())
        stores.remove(stores.join(self.url, STORE_SENTINEL))
        rotate(self.url.rsplit("/", 1)[0], limit)

    def cleanup(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


def _flag(rank: int, ok: bool) -> str:
    return written_flag(rank) if ok else f"{written_flag(rank)}.failed"


def destination(
    target: Path | str, automatic: bool, expected_bytes: int = 0, sharing: int = 1
) -> LocalDestination | StoreDestination:
    """The destination of a save into `target` (a local folder or a store URL); for a store,
    `expected_bytes` is what this process wrote at its last save, `sharing` the processes of
    this host staging at once."""
    if isinstance(target, str):
        return StoreDestination(target, expected_bytes, sharing)
    return LocalDestination(target, automatic)


SHM = "/dev/shm"


def staging_root(expected_bytes: int, sharing: int) -> str | None:
    """Where a process stages its files before they are uploaded: memory (/dev/shm) when
    TMPDIR is not set and both /dev/shm and the machine's available memory hold twice what
    every process of the host wrote at its last save (a staged file is then never written
    back to a disk, which on a cloud node's network disk is slower than the upload); else
    the temp directory (TMPDIR). None: the temp directory."""
    if not expected_bytes or os.environ.get("TMPDIR") or not os.access(SHM, os.W_OK):
        return None
    import psutil

    needed = 2 * expected_bytes * max(sharing, 1)
    if shutil.disk_usage(SHM).free < needed or psutil.virtual_memory().available < needed:
        return None
    return SHM


def fetch_checkpoint(url: str, rank: int | None, into: Path | None = None) -> Path:
    """A complete checkpoint in a store, copied into local folder `into` (a new one when
    None) for process `rank` (None: for every process of a host): every file but the other
    processes' RNG and process files (with accel's marker; a checkpoint accelerate wrote has
    them all) and the data files of DCP folders (read from the store when loaded, under
    `dcp_data_in_store`). The caller removes the folder."""
    from accel_bigmodel import stores

    files = stores.files_under(url)  # the one listing of the fetch
    names = {f.split("/", 1)[0] for f in files}
    state = state_of(names)
    if state != "complete":
        why = (
            f"a save into it was interrupted ({STORE_SENTINEL} is there, accel's {MARKER} is not)"
            if state == "interrupted"
            else f"neither accel's {MARKER} nor accelerate's {rng_file(0)} is there: the prefix "
            f"holds no checkpoint"
        )
        raise FileNotFoundError(f"{url} is not a complete checkpoint: {why}. Pass a complete one.")
    skip: set[str] = set()
    if MARKER in names and rank is not None:
        meta = json.loads(stores.read_bytes(stores.join(url, MARKER)))
        saved = int(meta.get("num_processes") or 1)
        mine = min(rank, saved - 1)
        skip = {f(r) for r in range(saved) if r != mine for f in (rng_file, process_file)}
    # DCP folders: their .metadata is fetched, their data files are read from the store by
    # each process, only the ranges it needs (accel_parallel.checkpoint.dcp_data_in_store)
    dcp = {f.rsplit("/", 1)[0] for f in files if f.endswith("/.metadata")}
    skip |= {f for f in files if f.endswith(".distcp") and f.rsplit("/", 1)[0] in dcp}
    local = Path(tempfile.mkdtemp(prefix="accel-download-")) if into is None else into
    local.mkdir(parents=True, exist_ok=True)
    try:
        stores.download(url, local, [f for f in files if f not in skip])
    except BaseException:
        shutil.rmtree(local, ignore_errors=True)
        raise
    return local
