"""Object stores behind fsspec URLs (s3://, gs://, az://, memory://), for the packages that
read and write checkpoints and weights in them. Needs the `s3` extra (fsspec, s3fs) on use.
"""

from accel_bigmodel._store import (
    StoreError,
    check_store,
    download,
    exists,
    files_under,
    filesystem,
    is_url,
    join,
    kind,
    list_names,
    local_path,
    name_of,
    read_bytes,
    read_into,
    remove,
    size,
    store_call,
    upload,
    write_bytes,
)

__all__ = [
    "StoreError",
    "check_store",
    "download",
    "exists",
    "files_under",
    "filesystem",
    "is_url",
    "join",
    "kind",
    "list_names",
    "local_path",
    "name_of",
    "read_bytes",
    "read_into",
    "remove",
    "size",
    "store_call",
    "upload",
    "write_bytes",
]
