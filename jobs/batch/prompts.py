"""The prompts of a batch run, read on the driver (pure but for the reading): parquet, JSON lines or
plain text (one prompt a line), a file or a directory of one format, local or gs://, as
`jobs.train --data` takes text (jobs.train.text.data_files). Each prompt keeps the input's own `id`
field as given; the row's index stands in where there is none."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

from jobs.runtime import storage

ID_FIELD = "id"


class BatchInputError(ValueError):
    """Input the run cannot use; the message is one line naming the flag and what would do."""


@dataclass(frozen=True)
class Prompts:
    ids: tuple[Any, ...]  # the input's `id` values, or the row indices
    texts: tuple[str, ...]
    source: str  # the files' format: parquet, json or text

    def __len__(self) -> int:
        return len(self.texts)


def read_prompts(uri: str, field: str) -> Prompts:
    """Every prompt at `uri` (files in name order, rows in file order); BatchInputError when they
    cannot be read, a row lacks `field`, or there are none."""
    from jobs.train.text import DataError, data_files

    try:
        kind, files = data_files(uri)
    except DataError as err:
        raise BatchInputError(f"argument --data: {err}".replace("training data", "prompts")) from None
    ids: list[Any] = []
    texts: list[str] = []
    scheme = uri.split("://", 1)[0] + "://" if storage.is_remote(uri) else ""
    for path in sorted(files):
        rows = _rows(scheme + path, kind, field)
        for n, (row_id, text) in enumerate(rows):
            if not isinstance(text, str):
                where = f"{posixpath.basename(path)} row {n + 1}"
                raise BatchInputError(f"argument --prompt-field: {where}'s {field!r} is {type(text).__name__}, not text")
            ids.append(len(ids) if row_id is None else row_id)
            texts.append(text)
    if not texts:
        raise BatchInputError(f"argument --data: {uri} holds no prompts")
    return Prompts(tuple(ids), tuple(texts), kind)


def _rows(path: str, kind: str, field: str) -> list[tuple[Any, Any]]:
    name = posixpath.basename(path)
    if kind == "text":
        lines = storage.read_bytes(path).decode().splitlines()
        return [(None, line) for line in lines if line.strip()]
    if kind == "json":
        out = []
        for number, line in enumerate(storage.read_bytes(path).decode().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise BatchInputError(f"argument --data: {name} line {number} is not JSON") from None
            if not isinstance(row, dict) or field not in row:
                raise BatchInputError(f"argument --prompt-field: {name} line {number} has no {field!r} field")
            out.append((row.get(ID_FIELD), row[field]))
        return out
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Whole, as one stream: every prompt is read on the driver anyway, and a stream is one request.
    table = pq.read_table(pa.BufferReader(storage.read_bytes(path)))
    if field not in table.column_names:
        columns = ", ".join(table.column_names) or "none"
        raise BatchInputError(f"argument --prompt-field: {name} has no {field!r} column (its columns: {columns})")
    texts = table.column(field).to_pylist()
    ids = table.column(ID_FIELD).to_pylist() if ID_FIELD in table.column_names else [None] * len(texts)
    return list(zip(ids, texts, strict=True))
