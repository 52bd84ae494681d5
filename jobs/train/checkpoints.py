"""Training checkpoints that are whole or not used at all.

A checkpoint is a directory with `state.npz` (every array, in order) and `meta.json` (the step, the
model config, and the size and SHA-256 of `state.npz`). `write` puts the state first and the meta
last, each under a temporary name, flushed to disk and renamed into place: a process killed mid-write
leaves no `meta.json`, so the directory is not a checkpoint. `load` checks the size and digest, so a
copy cut short (an upload to storage killed half-way, whatever order its files went in) is refused
with the reason rather than resumed from.

`newest_whole` picks the newest checkpoint that passes, given candidates newest first; `jobs.train`
gives it every checkpoint of the run in storage (`stored_candidates`: named by step, so they sort).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "state.npz"
META_FILE = "meta.json"
DIR_PREFIX = "checkpoint_step_"
_DIR_NAME = re.compile(rf"^{DIR_PREFIX}(\d+)(_[0-9a-z]+)?$")


class IncompleteCheckpointError(ValueError):
    """The directory is not a whole checkpoint; the message says what is missing or wrong."""


@dataclass(frozen=True)
class CheckpointMeta:
    step: int
    model: dict[str, Any]
    state_bytes: int
    state_sha256: str


def dir_name(step: int, tag: str | None = None) -> str:
    """The storage directory name of the checkpoint at `step`: zero-padded, so names sort by step,
    and tagged, so a rerun that reaches the same step again writes beside the old one, not over it
    (Ray Train would later delete the old one's directory, and with it the new one)."""
    return f"{DIR_PREFIX}{step:09d}_{tag or uuid.uuid4().hex[:8]}"


def step_of(name: str) -> int | None:
    """The step in a `dir_name`, or None for any other name (pure)."""
    match = _DIR_NAME.match(name)
    return int(match.group(1)) if match else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _replace_durably(tmp: Path, final: Path) -> None:
    """Flush `tmp` to disk, then rename it to `final` and flush the directory entry."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(directory: Path, arrays: Sequence[Any], step: int, model: dict[str, Any]) -> CheckpointMeta:
    """Write a checkpoint into `directory` (created if needed): state first, meta last."""
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    state = directory / STATE_FILE
    tmp = directory / f".{STATE_FILE}.partial"
    with open(tmp, "wb") as f:
        np.savez(f, *arrays)
    _replace_durably(tmp, state)
    meta = CheckpointMeta(step, dict(model), state.stat().st_size, _sha256(state))
    tmp = directory / f".{META_FILE}.partial"
    tmp.write_text(json.dumps(asdict(meta)))
    _replace_durably(tmp, directory / META_FILE)
    return meta


def read_meta(directory: Path) -> CheckpointMeta:
    path = directory / META_FILE
    try:
        data = json.loads(path.read_text())
        return CheckpointMeta(int(data["step"]), dict(data["model"]), int(data["state_bytes"]), str(data["state_sha256"]))
    except FileNotFoundError:
        raise IncompleteCheckpointError(f"{directory} has no {META_FILE}: its write never finished") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise IncompleteCheckpointError(f"{path} is unreadable ({type(err).__name__}: {err})") from None


def verify(directory: Path) -> CheckpointMeta:
    """The checkpoint's meta, once its state file is checked whole; else `IncompleteCheckpointError`."""
    meta = read_meta(directory)
    state = directory / STATE_FILE
    size = state.stat().st_size if state.is_file() else None
    if size != meta.state_bytes or _sha256(state) != meta.state_sha256:
        found = "missing" if size is None else f"{size} bytes" + (" with another digest" if size == meta.state_bytes else "")
        raise IncompleteCheckpointError(
            f"{state} is {found}, but {META_FILE} says {meta.state_bytes} bytes with sha256 "
            f"{meta.state_sha256[:12]}...: a write or copy that was cut short"
        )
    return meta


def load(directory: Path) -> tuple[CheckpointMeta, list[Any]]:
    """The checkpoint's meta and arrays, checked whole first."""
    import numpy as np

    meta = verify(directory)
    with np.load(directory / STATE_FILE) as stored:
        return meta, [stored[f"arr_{i}"] for i in range(len(stored.files))]


def newest_whole(
    candidates: Iterable[tuple[str, Callable[[], AbstractContextManager[str]]]],
    log: Callable[[str], None] = lambda line: None,
) -> tuple[CheckpointMeta, list[Any], str] | None:
    """The first candidate (newest first) that loads whole: its meta, arrays and name; None if none
    does. Each candidate is a name and a context manager giving a local directory (Ray Train's
    `Checkpoint.as_directory`, which downloads from remote storage); skipped ones are logged."""
    for name, as_directory in candidates:
        with as_directory() as local:
            try:
                meta, arrays = load(Path(local))
            except IncompleteCheckpointError as err:
                log(f"skipping checkpoint {name}: {err}")
                continue
        return meta, arrays, name
    return None


def stored_candidates(storage_path: str, run_name: str) -> list[tuple[str, Callable[[], AbstractContextManager[str]]]]:
    """Every checkpoint directory of the run in storage (a directory or gs://...), newest step first,
    as `newest_whole` candidates; reading one goes through Ray Train's `Checkpoint.as_directory`
    (a download from remote storage).

    Listed from storage rather than asked of Ray Train's registry (`ray.train.get_checkpoint()`):
    a checkpoint uploaded just before a host died may never have been registered, and ours check
    themselves, so a whole one is safe to resume from either way."""
    import pyarrow.fs
    from ray.train import Checkpoint

    uri = storage_path if "://" in storage_path else os.path.abspath(storage_path)
    fs, root = pyarrow.fs.FileSystem.from_uri(uri)
    entries = fs.get_file_info(pyarrow.fs.FileSelector(f"{root.rstrip('/')}/{run_name}", allow_not_found=True))
    found = [
        (step_of(e.base_name), e.base_name, e.path)
        for e in entries
        if e.type == pyarrow.fs.FileType.Directory and step_of(e.base_name) is not None
    ]
    return [(name, Checkpoint(path=path, filesystem=fs).as_directory) for _, name, path in sorted(found, reverse=True)]
