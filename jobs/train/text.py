"""Real text for training: files read with Ray Data, tokenized with a Hugging Face `tokenizers`
tokenizer, packed into fixed-length rows.

    python -m jobs.train --data PATH [--tokenizer tokenizer.json] ...   (PATH, tokenizer: local or gs://)

PATH is a file or a directory of parquet (a `text` column), JSON lines (a `text` field) or plain
text (one document per line) files, one format per run. Each document is encoded as the tokenizer
does for a prompt (its BOS first, as vLLM will see prompts), followed by its EOS; the token stream is
cut into rows of `seq_len + 1` (inputs and the next-token targets) within each batch of documents,
the tail of a batch dropped. Ray Data runs this in its own tasks; workers get rows with
`get_dataset_shard`, as with synthetic tokens. A corpus whose tokens fit easily in Ray's object
store is tokenized once, before training, and kept there (`CACHE_FRACTION`); a larger one streams,
tokenized as the workers read it.

The repo ships a corpus and a byte-level BPE tokenizer trained on it (`ASSETS`): its own README and
module docstrings, so nothing is downloaded and nothing is borrowed. `python -m jobs.train.text`
rebuilds both; a test checks that the shipped tokenizer is what that gives.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import posixpath
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

import numpy as np

from jobs.runtime import storage
from jobs.runtime.hf_tokenizer import EOS_TOKENS, eos_token_id, train_byte_bpe

ASSETS = Path(__file__).resolve().parent / "assets"
CORPUS = ASSETS / "corpus.jsonl"
TOKENIZER = ASSETS / "tokenizer.json"
VOCAB = 512  # the shipped tokenizer's size: byte-level BPE's 256 bytes, specials, merges
FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".txt": "text"}
TEXT_COLUMN = "text"
DOCS_PER_BATCH = 1024  # documents per tokenizing task call: few, large calls
# Ray Data re-runs a lazy dataset's reads and maps on every epoch, and a corpus smaller than the run
# is read epoch after epoch: on 2 cores that work took 15% of the training step's speed. Ray Data's
# own guidance (its training-ingest guide) is to `materialize()` a preprocessed dataset that fits
# in object store memory; we do when its tokens would take at most this share of the cluster's.
CACHE_FRACTION = 0.25
# Bytes of tokens per byte of files, at most: a byte-level BPE gives at most one token (int32) per
# byte of text, and parquet compresses text about 4x at most.
TOKEN_BYTES_PER_FILE_BYTE = {"parquet": 16, "json": 4, "text": 4}
CACHE_TIMEOUT_S = 600.0  # tokenizing a corpus small enough to keep takes seconds


class DataError(ValueError):
    """Training data or a tokenizer that cannot be used; the message names the path."""


@functools.lru_cache(maxsize=4)
def tokenizer_from_json(text: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(text)


def load_tokenizer(uri: str) -> tuple[str, Any]:
    """The tokenizer at `uri` (local or gs://) as its JSON text and a `tokenizers.Tokenizer`."""
    try:
        text = storage.read_bytes(uri).decode()
        return text, tokenizer_from_json(text)
    except (storage.StorageError, UnicodeDecodeError) as err:
        raise DataError(f"{err}") from None
    except Exception as err:  # tokenizers raises its own Exception for a file it cannot parse
        raise DataError(f"{uri} is not a Hugging Face tokenizer.json ({str(err)[:200]})") from None


def eos_id(tokenizer: Any, where: str) -> int:
    found = eos_token_id(tokenizer)
    if found is not None:
        return found
    raise DataError(f"{where} has none of the end-of-text tokens {', '.join(EOS_TOKENS)}: documents could not be separated")


def pack(docs: Sequence[Sequence[int]], eos: int, row_len: int) -> np.ndarray:
    """Documents, each followed by `eos`, concatenated and cut into rows of `row_len` tokens; the
    tail shorter than a row is dropped (pure)."""
    stream = [t for doc in docs for t in (*doc, eos)]
    rows = len(stream) // row_len
    return np.asarray(stream[: rows * row_len], np.int32).reshape(rows, row_len)


def _tokenize_and_pack(batch: dict[str, np.ndarray], tokenizer_json: str, row_len: int, eos: int) -> dict[str, np.ndarray]:
    # One thread per task: Ray Data already runs tasks in parallel, and tokenizers' own thread pool
    # would take every core of the host from the training step beside it.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tokenizer = tokenizer_from_json(tokenizer_json)
    texts = [str(t) for t in batch[TEXT_COLUMN] if t is not None and str(t).strip()]
    return {"tokens": pack([e.ids for e in tokenizer.encode_batch(texts)], eos, row_len)}


def data_files(uri: str) -> tuple[str, dict[str, int]]:
    """The format and the files (path -> bytes) of the training data at `uri` (one format: the
    extension says it)."""
    try:
        files = storage.file_sizes(uri)
    except storage.StorageError as err:
        raise DataError(str(err)) from None
    kinds = {FORMATS.get(posixpath.splitext(f)[1].lower()) for f in files}
    if not files or None in kinds:
        odd = [f for f in files if FORMATS.get(posixpath.splitext(f)[1].lower()) is None][:3]
        found = f"found {', '.join(odd)}" if odd else "found no files"
        raise DataError(f"{uri}: training data must be {', '.join(FORMATS)} files; {found}")
    if len(kinds) > 1:
        raise DataError(f"{uri} mixes {' and '.join(sorted(k for k in kinds if k))} files; use one format per run")
    return kinds.pop() or "", files


def kept_in_store(kind: str, file_bytes: int, store_bytes: float) -> bool:
    """Whether a corpus of `file_bytes` in `kind` files is tokenized once and kept in an object
    store of `store_bytes` rather than streamed (pure)."""
    return file_bytes * TOKEN_BYTES_PER_FILE_BYTE[kind] <= CACHE_FRACTION * store_bytes


def text_dataset(uri: str, tokenizer_uri: str, seq_len: int, keep: bool | None = None, timeout_s: float = CACHE_TIMEOUT_S):
    """A Ray Dataset of packed token rows ([seq_len + 1] each) from the text at `uri`: tokenized
    now and kept in the object store if `keep` (by default: when small enough, `kept_in_store`),
    else lazy, tokenized as it is read."""
    import ray
    import ray.data

    kind, sizes = data_files(uri)
    files = list(sizes)
    fs, _ = storage.filesystem(uri)
    tokenizer_json, tokenizer = load_tokenizer(tokenizer_uri)
    eos = eos_id(tokenizer, tokenizer_uri)
    if kind == "parquet":
        ds = ray.data.read_parquet(files, filesystem=fs).select_columns([TEXT_COLUMN])
    elif kind == "json":
        ds = ray.data.read_json(files, filesystem=fs, file_extensions=None)  # pyarrow reads JSON lines
    else:
        ds = ray.data.read_text(files, filesystem=fs)
    ds = ds.map_batches(
        _tokenize_and_pack,  # type: ignore[arg-type]  # Ray's stub types fn as one-argument; fn_kwargs supplies the rest
        fn_kwargs={"tokenizer_json": tokenizer_json, "row_len": seq_len + 1, "eos": eos},
        batch_size=DOCS_PER_BATCH,
        batch_format="numpy",
    )
    if keep is None:
        keep = kept_in_store(kind, sum(sizes.values()), ray.cluster_resources().get("object_store_memory", 0))
    if not keep:
        return ds
    pool = ThreadPoolExecutor(1)  # materialize() has no bound of its own
    try:
        return pool.submit(ds.materialize).result(timeout=timeout_s)
    except FutureTimeout:
        raise TimeoutError(f"tokenizing {uri} did not finish within {timeout_s:.0f}s (is the cluster out of CPUs?)") from None
    finally:
        pool.shutdown(wait=False)


# --- the shipped assets -------------------------------------------------------------------------


def corpus_documents(repo: Path) -> list[str]:
    """The repo's own prose: README paragraphs and every module docstring under infra/ and jobs/,
    each on one line (runs of spaces, which tables and code blocks align with, squeezed to one)."""
    texts = (repo / "README.md").read_text().split("\n\n")
    for path in sorted([*repo.glob("infra/**/*.py"), *repo.glob("jobs/**/*.py")]):
        texts.append(ast.get_docstring(ast.parse(path.read_text())) or "")
    docs = [" ".join(t.split()) for t in texts]
    return [d for d in docs if len(d) > 40]


def train_tokenizer(texts: Sequence[str], vocab_size: int = VOCAB):
    """The shipped tokenizer's recipe: a byte-level BPE with the serving tokenizer's special tokens."""
    return train_byte_bpe(texts, vocab_size, min_frequency=2)


def make_assets(repo: Path, out: Path = ASSETS) -> None:
    docs = corpus_documents(repo)
    out.mkdir(parents=True, exist_ok=True)
    (out / CORPUS.name).write_text("".join(json.dumps({TEXT_COLUMN: d}) + "\n" for d in docs))
    (out / TOKENIZER.name).write_text(train_tokenizer(docs).to_str(pretty=True) + "\n")


def shipped_documents() -> list[str]:
    return [json.loads(line)[TEXT_COLUMN] for line in CORPUS.read_text().splitlines()]


if __name__ == "__main__":
    make_assets(Path(__file__).resolve().parents[2], Path(sys.argv[1]) if len(sys.argv) > 1 else ASSETS)
    print(f"wrote {CORPUS} and {TOKENIZER}")
