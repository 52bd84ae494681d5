"""The loss claim of `make finetune-demo`: a run started from a Hugging Face directory (`jobs.train
--init-from`) has, at its first step, the source model's loss on that step's batch; a run from
random parameters does not.

Ray Data decides which rows each host reads, so "that step's batch" is made knowable instead of
recorded: the fine-tune reads a corpus of one short document, repeated, whose length in tokens (BOS,
text, EOS: what jobs.train.text packs) divides the row length. Every row then starts at a document's
start: every row is the same row, and any batch's loss is that row's loss.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from jobs.train import hf, hf_import, text

DOCUMENT = "Fine-tuned on a simulated TPU slice: imported from Hugging Face, trained, exported, and served by vLLM."


def repeated_row(tokenizer: Any, eos: int, max_seq_len: int, document: str = DOCUMENT) -> tuple[str, int, np.ndarray]:
    """The longest prefix (in words) of `document` that fits a row, the `--seq-len` under
    `max_seq_len` whose rows hold whole copies of it, and that row [seq_len + 1] (pure)."""
    words = document.split()
    while words:
        doc = " ".join(words)
        length = len(tokenizer.encode(doc).ids) + 1  # + EOS
        if length <= max_seq_len + 1:
            break
        words.pop()
    if not words or length < 2:
        raise ValueError(f"no prefix of {document!r} fits a row of {max_seq_len + 1} tokens")
    copies = (max_seq_len + 1) // length
    row = text.pack([tokenizer.encode(doc).ids] * copies, eos, copies * length)[0]
    return doc, copies * length - 1, row


def write_corpus(path: Path, document: str, copies: int = 2048) -> None:
    """`document` `copies` times, as JSON lines (`jobs.train --data`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({text.TEXT_COLUMN: document})
    path.write_text((line + "\n") * copies)


def source_loss(model_dir: str, row: np.ndarray) -> float:
    """The loss of the Hugging Face model in `model_dir` on `row`, imported as jobs.train imports it
    (float32, on this process's first device)."""
    import jax
    import jax.numpy as jnp

    from jobs.train.model import loss_fn, shapes

    cfg, _ = hf.parse_config(hf_import.read_config(model_dir))
    cfg = replace(cfg, seq_len=len(row) - 1)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: device, shapes(cfg), is_leaf=lambda s: isinstance(s, tuple))
    params = hf_import.import_checkpoint(model_dir, cfg, shardings)
    return float(loss_fn(params, jnp.asarray(row, jnp.int32)[None], cfg))
