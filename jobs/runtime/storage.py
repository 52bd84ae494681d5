"""One way to read and write a path that is a local directory or `gs://bucket/...`: the training
data and tokenizer, checkpoints' run directories and exports all go through here.

It is pyarrow's filesystem layer, the one Ray Data and Ray Train use themselves: the same
`FileSystem` object is handed to Ray Data's readers, so a path means the same thing to us and to
them. On GKE, `gs://` uses the pod's Workload Identity (Application Default Credentials).

`STORAGE_EMULATOR_HOST` (the variable Google's storage clients read) points `gs://` at a local GCS
emulator instead, without credentials: what the tests do. Orbax writes checkpoint arrays with
TensorStore's own GCS driver; `orbax_environment` gives it the same emulator.
"""

from __future__ import annotations

import os
import posixpath
from datetime import timedelta
from typing import Any

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


class StorageError(OSError):
    """A path that cannot be read or written; the message names it and says why."""


def is_remote(uri: str) -> bool:
    return "://" in uri


def join(uri: str, *parts: str) -> str:
    """`uri` with `parts` appended (pure; a local path is made absolute first)."""
    base = uri if is_remote(uri) else os.path.abspath(uri)
    return posixpath.join(base.rstrip("/"), *parts)


def filesystem(uri: str) -> tuple[Any, str]:
    """pyarrow's filesystem for `uri` and the path within it."""
    import pyarrow.fs

    emulator = os.environ.get(EMULATOR_ENV)
    if uri.startswith("gs://") and emulator:
        scheme, _, host = emulator.rpartition("://")
        fs = pyarrow.fs.GcsFileSystem(
            anonymous=True, scheme=scheme or "http", endpoint_override=host, retry_time_limit=timedelta(seconds=10)
        )
        return fs, uri[len("gs://") :]
    try:
        return pyarrow.fs.FileSystem.from_uri(uri if is_remote(uri) else os.path.abspath(uri))
    except Exception as err:
        raise StorageError(f"{uri}: not a path this job can use ({err})") from None


def read_bytes(uri: str) -> bytes:
    fs, path = filesystem(uri)
    try:
        with fs.open_input_stream(path) as f:
            return f.read()
    except FileNotFoundError:
        raise StorageError(f"{uri} does not exist") from None
    except OSError as err:
        raise StorageError(f"{uri} could not be read ({err})") from None


def write_bytes(uri: str, data: bytes) -> None:
    """Write `data` to `uri` whole: locally under a temporary name then renamed; a GCS object
    appears only once its upload completes."""
    fs, path = filesystem(uri)
    try:
        fs.create_dir(posixpath.dirname(path), recursive=True)
        target = path if is_remote(uri) else f"{path}.partial"
        with fs.open_output_stream(target) as f:
            f.write(data)
        if target != path:
            fs.move(target, path)
    except OSError as err:
        raise StorageError(f"{uri} could not be written ({err})") from None


def exists(uri: str) -> bool:
    import pyarrow.fs

    fs, path = filesystem(uri)
    return fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound


def list_files(uri: str) -> list[str]:
    """The files under `uri` (itself, if it is a file), sorted, as paths within its filesystem;
    hidden ones (`.` or `_` first, e.g. `_SUCCESS`) left out."""
    return list(file_sizes(uri))


def file_sizes(uri: str) -> dict[str, int]:
    """`list_files(uri)`, each with its size in bytes (one listing)."""
    import pyarrow.fs

    fs, path = filesystem(uri)
    info = fs.get_file_info(path)
    if info.type == pyarrow.fs.FileType.NotFound:
        raise StorageError(f"{uri} does not exist")
    if info.type == pyarrow.fs.FileType.File:
        return {path: info.size or 0}
    entries = fs.get_file_info(pyarrow.fs.FileSelector(path, recursive=True))
    return {
        e.path: e.size or 0
        for e in sorted(entries, key=lambda e: e.path)
        if e.type == pyarrow.fs.FileType.File and not any(part[:1] in "._" for part in e.path[len(path) :].split("/") if part)
    }


def orbax_environment() -> dict[str, str]:
    """What TensorStore (Orbax's array writer) needs to reach the same GCS as `filesystem`: its
    emulator URL when one is set; nothing otherwise."""
    emulator = os.environ.get(EMULATOR_ENV)
    if not emulator:
        return {}
    return {"TENSORSTORE_GCS_HTTP_URL": emulator if "://" in emulator else f"http://{emulator}"}
