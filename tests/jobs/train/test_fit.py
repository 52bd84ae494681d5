"""Training through Ray Train's JaxTrainer on a simulated v6e 4x4 slice: loss falls, a rerun
resumes from the newest checkpoint at the step where the first run stopped, every host writes its
own shards, and a newest checkpoint damaged after its commit is skipped for the one before it. The
runs share a persistent compilation cache: the first compiles its step, a second run of the same
program finds it there (JAX's own monitoring events), and the run's goodput ledger holds every
attempt."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.runtime import goodput, ledger
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


def run(storage: Path, steps: int, name: str = "resume", *extra: str) -> train_config.TrainResult:
    argv = ["--generation", "v6e", "--topology", "4x4", "--steps", str(steps), "--name", name, "--storage", str(storage), *extra]
    argv += ["--compilation-cache", str(storage / "xla-cache")]
    target, config, name, storage_path, budget = train_config.parse_config([*argv, *TINY, *FAST])
    report = train_fit.run_training(target, config, name, storage_path, budget, log=lambda line: None)
    assert report.ok and len(report.attempts) == 1, report.describe()
    return report.value


def tensorboard_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files of `logdir`, read by TensorBoard's own event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(logdir.glob("events.out.tfevents.*")):
        reader = EventAccumulator(str(events))
        reader.Reload()
        for tag in reader.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in reader.Scalars(tag))
    return {tag: sorted(values) for tag, values in out.items()}


def checkpoint_dirs(run_dir: Path) -> dict[int, Path]:
    """The run's committed Orbax checkpoints by step."""
    found = {checkpoints.step_of(p.name): p for p in run_dir.iterdir() if p.is_dir()}
    return {step: p for step, p in found.items() if step is not None and (p / "commit_success.txt").is_file()}


def test_loss_falls_a_rerun_resumes_and_a_cut_short_checkpoint_is_skipped(sim, tmp_path):
    first = run(tmp_path, 6, "resume", "--profile-steps", "2:3")
    # What a person looks at: TensorBoard's own reader finds every step's scalars in the run's
    # directory, the loss the run reported among them, and the profile of steps 2 and 3.
    scalars = tensorboard_scalars(tmp_path / "resume" / "tensorboard")
    assert [step for step, _ in scalars["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert scalars["train/loss"][-1][1] == pytest.approx(first.final_loss, rel=1e-6)
    assert {"train/learning_rate", "train/grad_norm", "train/step_time_s", "train/tokens_per_s", "run/goodput"} <= set(scalars)
    assert "train/mfu" not in scalars  # no peak off TPU
    assert scalars["run/goodput"] == [(6, pytest.approx(first.goodput["goodput"], rel=1e-6))]
    traces = list((tmp_path / "resume" / "profile").rglob("*.xplane.pb"))
    assert traces and all(b"train_step" in t.read_bytes() for t in traces)
    assert (first.start_step, first.steps) == (0, 6)
    assert first.cache_hits == 0  # an empty cache: the step was compiled (and written by process 0)
    assert first.final_loss < first.first_loss
    assert first.devices == 16 and first.processes == 4 and first.platform == "cpu"
    assert first.tokens_per_s > 0 and first.flops_per_s > 0 and first.mfu is None  # no MFU off TPU
    assert first.checkpoint and Path(first.checkpoint).is_relative_to(tmp_path / "resume")
    assert sorted(checkpoint_dirs(tmp_path / "resume")) == [3, 6]

    second = run(tmp_path, steps=9)
    assert (second.start_step, second.steps) == (6, 9)  # resumed where the first run stopped
    # Its step is another program (the learning-rate schedule runs to --steps): compiled, not found.
    assert second.cache_hits == 0
    twin = run(tmp_path, steps=6, name="twin")  # another run of the first one's program
    assert twin.start_step == 0 and twin.cache_hits >= 1  # its step's executable came from the cache
    # ...on process 0 only: JAX's key hashes the CPU client's topology, each process's own devices
    # (jax/_src/cache_key.py _hash_accelerator_config), so hosts 1-3 look up keys nobody wrote.
    # A TPU slice's hosts share one topology and all read process 0's entry.
    assert (first.hit_hosts, twin.hit_hosts) == (0, 1)
    assert "its executable from the compilation cache on 1 of 4 hosts" in twin.summary()  # what the job prints
    assert first.first_step_done_at > first.first_step_at > first.state_built_at  # through step 1 after entering it
    # The restored model is the trained one: it starts near where the first run ended, not at the
    # untrained loss.
    assert abs(second.first_loss - first.final_loss) < abs(first.first_loss - first.final_loss)
    assert second.final_loss < first.first_loss

    assert sorted(checkpoint_dirs(tmp_path / "resume")) == [6, 9]  # Orbax keeps the newest two
    # Every host wrote its own shards (no gather): one OCDBT directory per process.
    params = checkpoint_dirs(tmp_path / "resume")[9] / "params"
    assert sorted(p.name for p in params.glob("ocdbt.process_*")) == [f"ocdbt.process_{i}" for i in range(4)]

    # The newest checkpoint (step 9) damaged after its commit, as by a copy cut short: the next
    # run must not resume from it, but from the whole one before it (step 6), and write 9 again.
    for data in [p for p in params.rglob("*") if p.is_file() and p.parent.name == "d"]:
        data.write_bytes(data.read_bytes()[:10])
    third = run(tmp_path, steps=12)
    assert (third.start_step, third.steps) == (6, 12)
    assert sorted(checkpoint_dirs(tmp_path / "resume")) == [9, 12]

    # One ledger for the three submissions of the run, numbered on: restores, never a random init
    # after the first, and the steps 7-9 the damaged checkpoint lost counted as lost.
    events = ledger.read_events(ledger.ledger_uri(str(tmp_path / "resume")))
    assert [e["attempt"] for e in events if e["event"] == "attempt_start"] == [1, 2, 3]
    assert [(e["attempt"], e["how"]) for e in events if e["event"] == "initialized"] == [(1, "random")]
    assert [(e["attempt"], e["step"]) for e in events if e["event"] == "restored"] == [(2, 6), (3, 6)]
    account = goodput.account(events)
    assert account.last_step == 12 and third.goodput == account.as_dict()
    assert account.productive_s + sum(account.badput_s.values()) == pytest.approx(account.wall_s)
    assert account.badput_s[goodput.BadputType.WASTED_PROGRESS_FROM_DISRUPTION] > 0
