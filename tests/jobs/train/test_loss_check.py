"""jobs.train.loss_check, the fine-tune demo's loss claim: the repeated document packs into rows that
are all the same row (so any batch's loss is that row's), and the source model's loss on it is
computed from the directory as jobs.train imports it. The claim itself, on Ray Train, is checked in
tests/jobs/train/test_import_fit.py."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from jobs import demo
from jobs.train import hf, hf_import, loss_check, text
from jobs.train.model import ModelConfig, init_params, loss_fn


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer_json, tok = text.load_tokenizer(str(text.TOKENIZER))
    return tokenizer_json, tok, text.eos_id(tok, str(text.TOKENIZER))


@pytest.mark.parametrize("max_seq_len", [16, 64, 128])
def test_every_packed_row_of_the_corpus_is_the_same_row(tokenizer, tmp_path, max_seq_len):
    tokenizer_json, tok, eos = tokenizer
    document, seq_len, row = loss_check.repeated_row(tok, eos, max_seq_len)
    assert seq_len <= max_seq_len and len(row) == seq_len + 1 and (seq_len + 1) * 2 > max_seq_len + 1
    loss_check.write_corpus(tmp_path / "c.jsonl", document, copies=3000)
    docs = np.array([json.loads(line)[text.TEXT_COLUMN] for line in (tmp_path / "c.jsonl").read_text().splitlines()])
    for start in range(0, len(docs), text.DOCS_PER_BATCH):  # as Ray Data hands them to the packing task
        rows = text._tokenize_and_pack({text.TEXT_COLUMN: docs[start : start + text.DOCS_PER_BATCH]}, tokenizer_json, seq_len + 1, eos)
        assert len(rows["tokens"]) > 0 and (rows["tokens"] == row).all()


def test_the_source_loss_is_the_imported_models_and_not_a_random_ones(tokenizer, tmp_path):
    _, tok, eos = tokenizer
    cfg = ModelConfig(vocab=text.VOCAB, seq_len=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)
    params = init_params(cfg, 5)
    params["lm_head"] *= 30  # confident logits: a loss far from a random model's log(vocab)
    hf_import.write_dir(tmp_path / "m", hf.hf_config(cfg), hf.to_hf(params))
    _, seq_len, row = loss_check.repeated_row(tok, eos, cfg.seq_len)
    got = loss_check.source_loss(str(tmp_path / "m"), row)
    assert got == pytest.approx(float(loss_fn(params, row[None], cfg)), rel=1e-6)
    assert abs(got - float(loss_fn(init_params(cfg, 0), row[None], cfg))) > 1

    # The demo's verdict on the three step-1 losses.
    shutil.copy(text.TOKENIZER, tmp_path / "m" / "tokenizer.json")
    tune = demo.fine_tune(str(tmp_path / "m"), tmp_path / "corpus.jsonl")
    assert tune.source_loss == pytest.approx(got, rel=1e-6) and f"--seq-len {seq_len}" in tune.train_flags
    assert (tmp_path / "corpus.jsonl").is_file() and "--init-from" not in tune.scratch_flags

    def job(first_loss):
        return demo.JobOutcome("train", "id", "SUCCEEDED", 1.0, {"first_loss": first_loss})

    assert tune.verdict(job(got * (1 + 1e-6)), job(got - 3))[0]
    assert not tune.verdict(job(got + 0.1), job(got - 3))[0]  # the fine-tune did not start from the source
    assert not tune.verdict(job(got), job(got))[0]  # nor is a from-scratch run's the same
