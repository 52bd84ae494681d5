"""Training through Ray Train's JaxTrainer on a simulated v6e 4x4 slice: loss falls, a rerun
resumes from the newest checkpoint at the step where the first run stopped, and a newest checkpoint
that was cut short is skipped for the whole one before it."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.train import checkpoints
from jobs.train import config as train_config
from jobs.train import fit as train_fit

# Three Ray Train runs, about 4 minutes on 2 cores: `make test-slow` (and `make test-all`).
pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "16", "--vocab", "64", "--batch-size", "32"]
FAST = ["--learning-rate", "0.02", "--warmup-steps", "1", "--checkpoint-every", "3", "--reserve-timeout", "60"]


@pytest.fixture
def sim(shared_slice):
    return shared_slice


def run(storage: Path, steps: int) -> train_config.TrainResult:
    argv = ["--generation", "v6e", "--topology", "4x4", "--steps", str(steps), "--name", "resume", "--storage", str(storage)]
    target, config, name, storage_path, budget = train_config.parse_config([*argv, *TINY, *FAST])
    report = train_fit.run_training(target, config, name, storage_path, budget, log=lambda line: None)
    assert report.ok and len(report.attempts) == 1, report.describe()
    return report.value


def checkpoint_dirs(run_dir: Path) -> dict[int, Path]:
    return {checkpoints.step_of(p.name): p for p in run_dir.glob(f"{checkpoints.DIR_PREFIX}*") if p.is_dir()}


def test_loss_falls_a_rerun_resumes_and_a_cut_short_checkpoint_is_skipped(sim, tmp_path):
    first = run(tmp_path, steps=6)
    assert (first.start_step, first.steps) == (0, 6)
    assert first.final_loss < first.first_loss
    assert first.devices == 16 and first.processes == 4 and first.platform == "cpu"
    assert first.tokens_per_s > 0 and first.flops_per_s > 0 and first.mfu is None  # no MFU off TPU
    assert first.checkpoint and Path(first.checkpoint).is_relative_to(tmp_path / "resume")
    assert sorted(checkpoint_dirs(tmp_path / "resume")) == [3, 6]

    second = run(tmp_path, steps=9)
    assert (second.start_step, second.steps) == (6, 9)  # resumed where the first run stopped
    # The restored model is the trained one: it starts near where the first run ended, not at the
    # untrained loss.
    assert abs(second.first_loss - first.final_loss) < abs(first.first_loss - first.final_loss)
    assert second.final_loss < first.first_loss

    # A copy of the newest checkpoint (step 9) cut short, as by an upload killed half-way: the
    # next run must not resume from it, but from the whole one before it (step 6).
    state = checkpoint_dirs(tmp_path / "resume")[9] / checkpoints.STATE_FILE
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    third = run(tmp_path, steps=12)
    assert (third.start_step, third.steps) == (6, 12)
