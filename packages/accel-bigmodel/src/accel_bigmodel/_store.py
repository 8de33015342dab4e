"""Object stores behind fsspec URLs (s3://, gs://, az://, memory://): the one place that opens a
store, moves files in and out of it, and turns a store's failures into errors that name the URL
and the fix.

A local path, and a ``file://`` URL, are never handled here: callers keep their local code,
byte for byte. fsspec and the store's client (s3fs for s3://) are imported on first use,
from the `s3` extra; a scheme whose filesystem is not installed is an error naming the extra.
Credentials are the client's own (for S3: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY,
AWS_PROFILE, instance roles; AWS_ENDPOINT_URL for a server that is not AWS); no message
built here contains a secret.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# scheme -> (the fsspec implementation's package, what to install)
_CLIENTS = {
    "s3": ("s3fs", "pip install 'accel[s3]' (or 'accel-bigmodel[s3]': s3fs)"),
    "s3a": ("s3fs", "pip install 'accel[s3]' (or 'accel-bigmodel[s3]': s3fs)"),
    "gs": ("gcsfs", "pip install gcsfs"),
    "gcs": ("gcsfs", "pip install gcsfs"),
    "az": ("adlfs", "pip install adlfs"),
    "abfs": ("adlfs", "pip install adlfs"),
    "abfss": ("adlfs", "pip install adlfs"),
}
_FIX = {
    "s3": "check AWS_ENDPOINT_URL (the server's address) and that the server runs",
}
T = TypeVar("T")
_WINDOW = 16 * 2**20  # the most bytes `read_into` holds at once where it cannot stream


class StoreError(OSError):
    """A store refused or could not be reached; the message names the URL and the fix."""


def is_url(path: object) -> bool:
    """Whether `path` names an object in a store (a URL with a scheme other than file://)."""
    if not isinstance(path, str):
        return False
    match = _URL.match(path)
    return bool(match) and match.group(1).lower() != "file"


def local_path(path: str | os.PathLike[str]) -> Path:
    """`path` as a local Path (a file:// URL loses its scheme); refuses a store URL, so that
    a URL never becomes a local folder called ``s3:``."""
    if is_url(path):
        raise ValueError(
            f"{path!r} is an object-store URL where only a local path is accepted: pass a "
            f"local folder here."
        )
    text = os.fspath(path)
    return Path(text[len("file://") :] if text.lower().startswith("file://") else text)


def join(url: str, *names: str) -> str:
    """`url` with `names` appended, one slash between each."""
    return "/".join([url.rstrip("/"), *(n.strip("/") for n in names)])


def name_of(url: str) -> str:
    """The last part of `url` (its 'file name')."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for `url`; a scheme whose filesystem is not
    installed is an ImportError naming what to install."""
    scheme = _URL.match(url).group(1).lower() if _URL.match(url) else ""
    try:
        import fsspec
    except ImportError:
        raise ImportError(
            f"{url!r} is an object-store URL, and reading or writing one needs fsspec and the "
            f"store's client: {_CLIENTS.get(scheme, ('', 'pip install fsspec'))[1]}."
        ) from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as err:
        package, install = _CLIENTS.get(scheme, (None, None))
        if install is None and "Protocol not known" not in str(err):
            raise
        raise ImportError(
            f"no filesystem for {scheme}:// URLs is installed ({url!r}): "
            f"{install or 'install the fsspec implementation for ' + repr(scheme)}."
        ) from None


def store_call(url: str, action: str, call: Callable[[], T]) -> T:
    """`call()`, with a store's failure re-raised as a StoreError naming `url`, what was
    being done (`action`) and the fix."""
    try:
        return call()
    except FileNotFoundError as err:
        if "bucket" in str(err).lower():
            raise _bucket_missing(url) from err
        raise
    except EOFError:  # an object shorter than asked
        raise
    except Exception as err:
        raise explain(err, url, action) from err


def explain(err: BaseException, url: str, action: str) -> BaseException:
    """A clear error for `err`, raised by the store while `action` on `url`."""
    scheme = url.split("://", 1)[0].lower()
    name = type(err).__name__
    text = str(err)
    if name in ("NoCredentialsError", "PartialCredentialsError") or "credentials" in text.lower():
        return StoreError(
            f"no credentials for {url} ({action}): set the store's credentials (for S3: "
            f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)."
        )
    if isinstance(err, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        kind = "read" if action in ("reaching", "reading", "listing", "downloading") else "write"
        return StoreError(
            f"the store refused {action} {url} (access denied): give these credentials "
            f"{kind} access to that prefix, or choose a prefix they may {kind}."
        )
    if _unreachable(err):
        return StoreError(
            f"the store for {url} does not answer ({action}; {name}): "
            f"{_FIX.get(scheme, 'check the endpoint and the network')}."
        )
    return StoreError(f"{action} {url} failed: {name}: {text[:300]}")


def _unreachable(err: BaseException) -> bool:
    seen: BaseException | None = err
    while seen is not None:
        kind = type(seen).__name__
        if isinstance(seen, (ConnectionError, TimeoutError)) or kind in (
            "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
            "ClientConnectorError", "ServerDisconnectedError", "ConnectionClosedError",
        ):  # fmt: skip
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _bucket_missing(url: str) -> FileNotFoundError:
    bucket = url.split("://", 1)[1].split("/", 1)[0]
    return FileNotFoundError(
        f"the bucket {bucket!r} of {url} does not exist: create it, or fix the URL."
    )


def check_store(url: str, *, write: bool) -> None:
    """Fail now, naming `url` and the fix, where a save or load into it would fail later:
    no filesystem for the scheme, a missing bucket, no credentials, an endpoint that does not
    answer, or (`write`) a prefix these credentials may not write."""
    fs, path = filesystem(url)
    if hasattr(fs, "connect_timeout"):  # s3fs: answer in seconds, not after minutes of retries
        fs, path = _quick(url)
    bucket = path.split("/", 1)[0]
    if hasattr(fs, "call_s3"):  # one request that answers for the bucket alone
        reach = lambda: fs.call_s3("head_bucket", Bucket=bucket)  # noqa: E731
    else:
        reach = lambda: fs.info(bucket)  # noqa: E731
    try:
        store_call(url, "reaching", reach)
    except FileNotFoundError:
        raise _bucket_missing(url) from None
    except StoreError as err:
        if not (write and "access denied" in str(err)):
            raise  # no credentials, no answer: nothing else would work either
        # may not ask about the bucket (S3 wants ListBucket for that): the write decides
    if write:
        probe = f"{path.rstrip('/')}/.accel-probe-{uuid.uuid4().hex}"
        store_call(url, "writing into", lambda: fs.pipe_file(probe, b""))
        store_call(url, "deleting from", lambda: fs.rm_file(probe))


def _quick(url: str) -> tuple[Any, str]:
    """A filesystem for `url` that gives up after one attempt of a few seconds."""
    import fsspec

    protocol, path = url.split("://", 1)
    fs = fsspec.filesystem(
        protocol, skip_instance_cache=True,
        config_kwargs={"connect_timeout": 5, "read_timeout": 15, "retries": {"max_attempts": 1}},
    )  # fmt: skip
    return fs, path


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return store_call(url, "reading", lambda: fs.exists(path))


def kind(url: str) -> str | None:
    """ "file" when `url` names an object, "folder" when objects sit under it (a prefix), None
    when neither."""
    fs, path = filesystem(url)
    try:
        info = store_call(url, "reading", lambda: fs.info(path))
    except FileNotFoundError:
        return None
    return "folder" if info.get("type") == "directory" else "file"


def read_bytes(url: str, start: int | None = None, end: int | None = None) -> bytes:
    """The bytes of `url` (from `start` to `end` when given: a ranged read)."""
    fs, path = filesystem(url)
    return store_call(url, "reading", lambda: fs.cat_file(path, start=start, end=end))


def read_into(url: str, start: int, end: int, pieces: Sequence[tuple[int, memoryview]]) -> None:
    """Fill each (offset, view) of `pieces` with the bytes of `url` from that offset on: one
    ranged read of [start, end), which holds the pieces in ascending order (bytes between them
    are read and dropped). With s3fs the response is streamed straight into the views (nothing
    else is held); other stores read windows of at most `_WINDOW` bytes. Raises EOFError when
    the object ends before `end`."""
    fs, path = filesystem(url)
    if getattr(fs, "async_impl", False) and hasattr(fs, "_call_s3"):
        from fsspec.asyn import sync

        task = lambda: sync(fs.loop, _stream_s3, fs, path, start, end, pieces)  # noqa: E731
        store_call(url, "reading", task)
        return
    for low in range(start, end, _WINDOW):
        high = min(end, low + _WINDOW)
        data = memoryview(read_bytes(url, low, high))
        if len(data) < high - low:
            raise EOFError(f"{url} ends at byte {low + len(data)}, before byte {end}")
        for offset, view in pieces:
            a, b = max(low, offset), min(high, offset + len(view))
            if a < b:
                view[a - offset : b - offset] = data[a - low : b - low]


async def _stream_s3(
    fs: Any, path: str, start: int, end: int, pieces: Sequence[tuple[int, memoryview]]
) -> None:
    bucket, key, version = fs.split_path(path)
    extra = {"VersionId": version} if version else {}
    response = await fs._call_s3(
        "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra
    )
    body, position = response["Body"], start
    try:
        for offset, view in pieces:
            while position < offset:  # a gap between pieces
                skipped = len(await body.read(min(offset - position, _WINDOW)))
                if not skipped:
                    raise EOFError(f"s3://{path} ends at byte {position}, before byte {end}")
                position += skipped
            done = 0
            while done < len(view):
                count = await body.readinto(view[done:])
                if not count:
                    raise EOFError(f"s3://{path} ends at byte {position + done}, before {end}")
                done += count
            position += done
    finally:
        body.close()


def write_bytes(url: str, data: bytes) -> None:
    fs, path = filesystem(url)
    store_call(url, "writing", lambda: fs.pipe_file(path, data))


def size(url: str) -> int:
    fs, path = filesystem(url)
    return int(store_call(url, "reading", lambda: fs.size(path)))


def list_names(url: str) -> list[str]:
    """The names directly under `url` (files and folders), sorted; [] when there is none."""
    fs, path = filesystem(url)
    try:
        found = store_call(url, "listing", lambda: fs.ls(path, detail=False, refresh=True))
    except FileNotFoundError:
        return []
    return sorted({p.rstrip("/").rsplit("/", 1)[-1] for p in found if p.rstrip("/") != path})


def files_under(url: str) -> list[str]:
    """Every file under `url`, as paths relative to it, sorted."""
    fs, path = filesystem(url)
    root = path.rstrip("/") + "/"
    try:
        found = store_call(url, "listing", lambda: fs.find(root))
    except FileNotFoundError:
        return []
    return sorted(p[len(root) :] for p in found if p.startswith(root))


def remove(url: str) -> None:
    """Delete everything under `url` (nothing when there is nothing)."""
    fs, path = filesystem(url)
    try:
        store_call(url, "deleting", lambda: fs.rm(path, recursive=True))
    except FileNotFoundError:
        pass
    fs.invalidate_cache(path)


def upload(local: Path, url: str, files: Iterable[str] | None = None) -> int:
    """Copy the files under local folder `local` (or only `files`, relative paths) to `url`,
    concurrently; returns the bytes sent."""
    names = sorted(files) if files is not None else _local_files(local)
    if not names:
        return 0
    fs, path = filesystem(url)
    sources = [os.fspath(local / n) for n in names]
    targets = [f"{path.rstrip('/')}/{n}" for n in names]
    store_call(url, "uploading to", lambda: fs.put(sources, targets))
    fs.invalidate_cache(path)
    return sum(os.path.getsize(s) for s in sources)


def download(url: str, local: Path, files: Iterable[str] | None = None) -> int:
    """Copy the files under `url` (every one, or only `files`, paths relative to it) into
    local folder `local`, concurrently; returns the bytes received."""
    names = files_under(url) if files is None else sorted(files)
    if not names:
        return 0
    fs, path = filesystem(url)
    sources = [f"{path.rstrip('/')}/{n}" for n in names]
    targets = [os.fspath(local / n) for n in names]
    for target in targets:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
    store_call(url, "downloading", lambda: fs.get(sources, targets))
    return sum(os.path.getsize(t) for t in targets)


def _local_files(local: Path) -> list[str]:
    return sorted(os.fspath(p.relative_to(local)) for p in local.rglob("*") if p.is_file())


@contextlib.contextmanager
def fetched(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A local folder holding what `path` holds: `path` itself when it is local, else a
    temporary copy of the store prefix, removed afterwards."""
    if not is_url(path):
        yield local_path(path)
        return
    local = Path(tempfile.mkdtemp(prefix="accel-download-"))
    try:
        if not download(str(path), local):
            raise FileNotFoundError(f"{path} holds nothing: pass a URL under which files are.")
        yield local
    finally:
        shutil.rmtree(local, ignore_errors=True)


@contextlib.contextmanager
def published(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A local folder to write into for `path`: `path` itself when it is local, else a
    temporary folder uploaded to the store prefix when the block succeeds, then removed."""
    if not is_url(path):
        yield local_path(path)
        return
    local = Path(tempfile.mkdtemp(prefix="accel-upload-"))
    try:
        yield local
        upload(local, str(path).rstrip("/"))
    finally:
        shutil.rmtree(local, ignore_errors=True)
