"""Synthetic training data: token rows made on each worker from the step and its rank (numpy only).
Real text goes through Ray Data instead (jobs.train.text)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

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


def synthetic_batches(
    start_step: int, global_batch: int, rank: int, local_batch: int, seq_len: int, vocab: int
) -> Iterator[dict[str, np.ndarray]]:
    """This worker's batches from step `start_step` on: rows `step * global_batch + rank *
    local_batch` onwards, so the ranks' rows tile each global batch and a resumed run sees the rows
    it would have seen (pure).

    Made here, not through Ray Data: generating a batch takes microseconds, while a Ray Data
    pipeline costs seconds of start-up on every attempt (a coordinator actor, read tasks, their
    worker processes: 7 s to the first batch measured on the 2-core simulation).
    """
    for step in itertools.count(start_step):
        first = step * global_batch + rank * local_batch
        yield {"tokens": synthetic_tokens(np.arange(first, first + local_batch), seq_len, vocab)}
