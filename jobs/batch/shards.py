"""A batch run's output: parquet shards of `rows` prompts each, each committed whole, so that a rerun
with the same `--output` skips what is done and writes every input row exactly once (pure rules, and
the reading and writing of shards).

`--output` holds only `shard-<index>.parquet` files. A local shard is written under a hidden name
(`.shard-<index>.parquet.tmp`, which readers of a parquet directory skip) and renamed, which is
atomic; a gs:// shard is uploaded to its name, and a GCS object appears whole when its upload ends.
Each shard's parquet metadata records what made it (`RunKey`: the input, its size, the shard size,
the model and sampling): a rerun against an output of another run is refused, not mixed into it
(one shard is read to tell: all of an output's shards share their key).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
from dataclasses import asdict, dataclass

from jobs.runtime import storage

SHARD = re.compile(r"^shard-(\d{6})\.parquet$")
LEFTOVER = re.compile(r"^\.shard-\d{6}\.parquet\.tmp$")
META_KEY = b"jobs.batch"
COLUMNS = ("id", "prompt", "completion", "prompt_tokens", "completion_tokens", "finish_reason")


class OutputError(ValueError):
    """An --output the run cannot use; one line."""


@dataclass(frozen=True)
class RunKey:
    """What a shard was made from: a rerun must match it to add to the same output."""

    data: str
    rows: int
    shard_rows: int
    model: str
    max_tokens: int
    temperature: float


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.parquet"


def plan(rows: int, shard_rows: int) -> list[range]:
    """The shards of `rows` input rows, `shard_rows` each (the last one shorter) (pure)."""
    return [range(start, min(start + shard_rows, rows)) for start in range(0, rows, shard_rows)]


def _entries(output: str) -> list[str] | None:
    """The names in the --output directory; None when it does not exist. OutputError when it is a file."""
    import pyarrow.fs

    fs, path = storage.filesystem(output)
    info = fs.get_file_info(path)
    if info.type == pyarrow.fs.FileType.NotFound:
        return None
    if info.type == pyarrow.fs.FileType.File:
        raise OutputError(f"argument --output: {output} is a file; pass a directory (new, or one a run of this input wrote)")
    return [posixpath.basename(e.path) for e in fs.get_file_info(pyarrow.fs.FileSelector(path))]


def committed(output: str, key: RunKey) -> set[int]:
    """The shards already committed to `output` by a run of the same `key`; OutputError when the
    directory holds anything else (files of another kind, or shards of another run)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = _entries(output)
    if names is None:
        return set()
    others = sorted(n for n in names if not SHARD.match(n) and not LEFTOVER.match(n))
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise OutputError(f"argument --output: {output} holds other files ({shown}); pass a new directory or one a batch run wrote")
    done = {int(m.group(1)) for m in map(SHARD.match, names) if m}
    if done:
        # One shard's metadata stands for all: a run of another key is refused here before it writes,
        # so every shard of an output has the same. Read as one stream (a shard is small), not with
        # ranged reads: the footer alone would need two round trips on GCS anyway.
        shard = pa.BufferReader(storage.read_bytes(storage.join(output, shard_name(min(done)))))
        theirs = json.loads((pq.read_schema(shard).metadata or {}).get(META_KEY, b"{}"))
        if theirs != asdict(key):
            differs = sorted(k for k in asdict(key) if theirs.get(k) != asdict(key)[k])
            raise OutputError(
                f"argument --output: {output} holds shards of another run (its {', '.join(differs) or 'metadata'} differ); "
                "pass a new directory, or the same input, model and settings to finish that run"
            )
    return done


def clear_leftovers(output: str) -> None:
    """Remove the hidden partial files of a run that was killed mid-write (local only)."""
    if storage.is_remote(output):
        return
    for name in _entries(output) or []:
        if LEFTOVER.match(name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(output, name))


def write_shard(output: str, index: int, columns: dict[str, list], key: RunKey) -> str:
    """Commit one shard whole; its URI."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({c: columns[c] for c in COLUMNS}).replace_schema_metadata({META_KEY: json.dumps(asdict(key)).encode()})
    uri = storage.join(output, shard_name(index))
    if storage.is_remote(output):
        fs, path = storage.filesystem(uri)
        pq.write_table(table, path, filesystem=fs)  # a GCS object appears whole, when its upload ends
        return uri
    os.makedirs(output, exist_ok=True)
    tmp = os.path.join(output, f".{shard_name(index)}.tmp")
    pq.write_table(table, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, uri)
    return uri
