"""`jobs.train --init-from` end to end on the simulated v6e 4x4 slice (Ray Train, 4 hosts, 16
devices): an import trained at learning rate 0 exports the tensors it imported, bit for bit, and
its loss is the source model's on the same rows; and after an import, a killed host's rerun resumes
from the run's checkpoint, never from the import again."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from infra import catalog
from jobs import REPO_ROOT
from jobs.runtime.outcomes import HostLost, Succeeded
from jobs.train import checkpoints, hf, hf_import, loss_check, text
from jobs.train import config as train_config
from jobs.train import fit as train_fit
from jobs.train.model import ModelConfig, init_params, loss_fn
from tests.jobs.sim import SHARED_SLICE, SimHost
from tests.jobs.train.test_fit_faults import BackgroundFit

# Three Ray Train runs (one, then two around a killed host): about 5 minutes on 2 cores.
pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SHAPE = catalog.shape("v6e", "4x4")
# The shipped tokenizer's vocab (the export needs a tokenizer); a tied head and Llama 3's rope
# scaling, so that the export's writing them back is checked too.
CFG = ModelConfig(
    vocab=text.VOCAB, seq_len=16, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64,
    rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_positions=8,
)  # fmt: skip
SLICE = ["--generation", "v6e", "--topology", "4x4", "--reserve-timeout", "120", "--batch-size", "32"]


@pytest.fixture
def sim(shared_slice):
    return shared_slice


def make_source(where: Path, seed: int = 7) -> dict[str, np.ndarray]:
    """A random Hugging Face Llama directory of CFG (tied head, two shards, the shipped tokenizer);
    its tensors."""
    params = init_params(CFG, seed)
    params["norm_f"] = np.linspace(0.5, 1.5, CFG.d_model, dtype=np.float32)  # not all ones: a misplaced norm shows
    params["embed"] *= 30  # confident logits: a loss far from a random model's log(vocab)
    tensors = hf.to_hf(params)
    del tensors[hf.HEAD]
    hf_import.write_dir(where, {**hf.hf_config(CFG), "tie_word_embeddings": True}, tensors, shard_bytes=40_000)
    shutil.copy(text.TOKENIZER, where / hf_import.TOKENIZER_FILE)
    return tensors


def newest_meta(run_dir: Path) -> dict:
    import orbax.checkpoint as ocp

    manager = checkpoints.open_manager(str(run_dir), asynchronous=False, keep=None, read_only=True)
    try:
        return dict(manager.restore(manager.latest_step(), args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])
    finally:
        manager.close()


def test_an_import_at_learning_rate_0_exports_what_it_imported_and_keeps_the_source_loss(sim, tmp_path):
    source = make_source(tmp_path / "source")
    # What `make finetune-demo` trains on: one document repeated, every row the same row, so that
    # the step's batch is known whichever host reads which rows (jobs.train.loss_check).
    _, tok = text.load_tokenizer(str(text.TOKENIZER))
    document, seq_len, row = loss_check.repeated_row(tok, text.eos_id(tok, "shipped"), CFG.seq_len)
    loss_check.write_corpus(tmp_path / "corpus.jsonl", document, copies=256)
    argv = [*SLICE, "--init-from", str(tmp_path / "source"), "--learning-rate", "0", "--steps", "2", "--checkpoint-every", "1"]
    argv += ["--data", str(tmp_path / "corpus.jsonl"), "--seq-len", str(seq_len)]
    target, config, name, storage, budget = train_config.parse_config([*argv, "--name", "check", "--storage", str(tmp_path / "runs")])
    assert ModelConfig(**config.model) == replace(CFG, seq_len=seq_len)
    report = train_fit.run_training(target, config, name, storage, budget, log=lambda line: None)
    assert report.ok and len(report.attempts) == 1, report.describe()
    result = report.value
    assert (result.start_step, result.steps, result.processes, result.devices) == (0, 2, 4, 16)
    meta = newest_meta(tmp_path / "runs" / "check")
    assert meta["init_from"] == str(tmp_path / "source") and meta["step"] == 2

    # Step 1's loss is the source model's on that batch (as is step 2's: learning rate 0), which a
    # run from random parameters does not start at.
    source_loss = loss_check.source_loss(str(tmp_path / "source"), row)
    assert abs(result.first_loss - source_loss) < 1e-5 * max(1.0, source_loss), (result, source_loss)
    assert abs(result.final_loss - source_loss) < 1e-5 * max(1.0, source_loss), (result, source_loss)
    scratch_loss = float(loss_fn(init_params(replace(CFG, seq_len=seq_len), 0), row[None], replace(CFG, seq_len=seq_len)))
    assert abs(scratch_loss - source_loss) > 1

    out = tmp_path / "exported"
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.export", "--storage", str(tmp_path / "runs"), "--name", "check", "--out", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    from safetensors.numpy import load_file

    exported = load_file(out / "model.safetensors")
    assert set(exported) == {*source, hf.HEAD}
    for tensor, value in source.items():
        np.testing.assert_array_equal(exported[tensor], value, err_msg=tensor)  # bit for bit: float32 in and out
    np.testing.assert_array_equal(exported[hf.HEAD], source[hf.EMBED])  # the tied head, untied
    written = json.loads((out / "config.json").read_text())
    assert hf.parse_config(written) == (replace(CFG, seq_len=seq_len), False)  # the rope scaling written back


def test_after_an_import_a_killed_host_resumes_from_the_checkpoint_not_the_import(sim, tmp_path):
    steps, every = 60, 10
    make_source(tmp_path / "source")
    argv = [
        *SLICE, "--init-from", str(tmp_path / "source"), "--name", "ft", "--storage", str(tmp_path),
        "--steps", str(steps), "--checkpoint-every", str(every), "--max-preemptions", "1",
        "--learning-rate", "0.01", "--warmup-steps", "1",
    ]  # fmt: skip
    fit = BackgroundFit(argv)
    name = fit.name
    at_kill = fit.checkpointed(tmp_path / name, every, steps)
    # The source is gone before the rerun starts: a rerun that imported again would fail on it.
    (tmp_path / "source").rename(tmp_path / "moved")

    sim.kill_host(SHARED_SLICE, 1)
    sim.add_host(SimHost(SHAPE, SHARED_SLICE, 1))  # GKE recreates the VM

    report = fit.report()
    first, second = report.attempts
    assert isinstance(first.outcome, HostLost) and isinstance(second.outcome, Succeeded)
    result = report.value
    assert at_kill <= result.start_step < steps and result.steps == steps  # resumed, not imported (step 0)
    assert newest_meta(tmp_path / name)["init_from"] == str(tmp_path / "source")  # the first run's note, kept
    assert (tmp_path / name / checkpoints.TOKENIZER_FILE).read_bytes() == text.TOKENIZER.read_bytes()  # kept at the start
