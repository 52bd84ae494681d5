"""Training data: synthetic token rows, fed through Ray Data (numpy only: no JAX in data workers)."""

from __future__ import annotations

import numpy as np


def synthetic_tokens(row_ids: np.ndarray, seq_len: int, vocab: int, noise: float = 0.05) -> np.ndarray:
    """Learnable token rows [len(row_ids), seq_len + 1], deterministic per row id (pure).

    Each row is an arithmetic sequence mod `vocab` with a per-row start and stride (1..7), with a
    few tokens replaced at random: a model must read the context to predict the next token, and
    the loss falls well below log(vocab) within a few dozen steps.
    """
    out = np.empty((len(row_ids), seq_len + 1), np.int32)
    positions = np.arange(seq_len + 1)
    for i, row in enumerate(np.asarray(row_ids).tolist()):
        rng = np.random.default_rng(int(row))
        start, stride = rng.integers(vocab), rng.integers(1, 8)
        seq = (start + stride * positions) % vocab
        flip = rng.random(seq_len + 1) < noise
        seq[flip] = rng.integers(vocab, size=int(flip.sum()))
        out[i] = seq
    return out


def _token_batch(batch: dict[str, np.ndarray], seq_len: int, vocab: int) -> dict[str, np.ndarray]:
    return {"tokens": synthetic_tokens(batch["id"], seq_len, vocab)}


def synthetic_dataset(rows: int, seq_len: int, vocab: int, blocks: int = 1):
    """A Ray Dataset of `rows` token rows; Ray Train splits it between the workers.

    One block by default: generating tokens is cheap, and each block is a task whose first run
    costs a worker-process start (measured on 2 cores: 2 s to the first batch with one block, 7-10 s
    with four). A real corpus would be read with one block per file instead.
    """
    import ray.data

    return ray.data.range(rows, override_num_blocks=max(1, blocks)).map_batches(
        _token_batch,  # type: ignore[arg-type]  # Ray's stub types fn as one-argument; fn_kwargs supplies the rest
        fn_kwargs={"seq_len": seq_len, "vocab": vocab},
        batch_format="numpy",
    )
