"""Losing a host in the middle of `train`: the failed Ray Train run is classified as a lost host and
rerun (under --max-preemptions) as a whole worker group on a complete slice (here the host comes
back, as GKE recreates a lost TPU VM) from the newest checkpoint, and the run still ends at the asked
step having lost at most one checkpoint interval. A wedged worker (SIGSTOP: no error, no progress)
is found by the step watchdogs and handled the same way."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from infra import catalog
from jobs.runtime import goodput, ledger
from jobs.runtime.outcomes import HostLost, Succeeded
from jobs.train import checkpoints
from jobs.train import config as train_config
from jobs.train import fit as train_fit
from tests.jobs.sim import SHARED_SLICE, SimHost

# Each is two Ray Train runs and a fault between them: 2.5-4 minutes on 2 cores, so `make test-slow`.
pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SHAPE = catalog.shape("v6e", "4x4")
TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "16", "--vocab", "64", "--batch-size", "32"]
STEPS, EVERY = 60, 10


@pytest.fixture
def sim(shared_slice):
    return shared_slice


def newest_checkpoint_step(run_dir: Path) -> int:
    """The newest committed checkpoint's step (Orbax marks a commit with commit_success.txt)."""
    steps = [0]
    for marker in run_dir.glob(f"{checkpoints.STEP_PREFIX}_*/commit_success.txt"):
        step = checkpoints.step_of(marker.parent.name)
        steps.append(step if step is not None else 0)
    return max(steps)


class BackgroundFit:
    """`run_training` on a thread of its own, so that a test can fault a host while it trains."""

    def __init__(self, argv: list[str]):
        target, config, self.name, storage, budget = train_config.parse_config(argv)
        self.outcome: dict = {}

        def fit():
            try:
                self.outcome["report"] = train_fit.run_training(target, config, self.name, storage, budget, log=lambda line: None)
            except BaseException as err:
                self.outcome["error"] = err

        self.runner = threading.Thread(target=fit, daemon=True)
        self.runner.start()

    def checkpointed(self, run_dir: Path, step: int, steps: int) -> int:
        """Wait (300 s at most) for a committed checkpoint at `step` or later, while training goes
        on; the newest committed step then."""
        deadline = time.monotonic() + 300
        while newest_checkpoint_step(run_dir) < step and self.runner.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.runner.is_alive(), f"training ended before the host could be killed: {self.outcome}"
        at = newest_checkpoint_step(run_dir)
        assert 0 < at < steps
        return at

    def report(self, timeout_s: float = 400):
        """The run's report once it ends (within `timeout_s` of the fault), which must be ok."""
        self.runner.join(timeout=timeout_s)
        assert not self.runner.is_alive(), f"training did not finish within {timeout_s:.0f} s of the host loss"
        assert "error" not in self.outcome, self.outcome.get("error")
        report = self.outcome["report"]
        assert report.ok, report.describe()
        return report


def test_a_killed_host_mid_training_restarts_from_the_newest_checkpoint(sim, tmp_path):
    argv = [
        *("--generation", "v6e", "--topology", "4x4", "--name", "ft", "--storage", str(tmp_path)),
        *("--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--max-preemptions", "1", "--reserve-timeout", "120"),
        *("--learning-rate", "0.02", "--warmup-steps", "1", "--compilation-cache", str(tmp_path / "xla-cache")),
        *TINY,
    ]
    fit = BackgroundFit(argv)
    at_kill = fit.checkpointed(tmp_path / fit.name, EVERY, STEPS)

    sim.kill_host(SHARED_SLICE, 2)
    sim.add_host(SimHost(SHAPE, SHARED_SLICE, 2))  # GKE recreates the VM

    report = fit.report()
    first, second = report.attempts
    assert isinstance(first.outcome, HostLost) and f"worker 2 of slice {SHARED_SLICE}" in first.outcome.reason
    assert isinstance(second.outcome, Succeeded)
    result = report.value
    assert result.steps == STEPS  # what was asked
    # The restarted worker group resumed from a checkpoint no older than the newest one at the kill:
    # at most one checkpoint interval of work was lost.
    assert at_kill <= result.start_step < STEPS
    assert result.processes == SHAPE.hosts

    # The ledger, as `python -m jobs.goodput` reads it: two attempts, the second restoring into the
    # abstract shapes (no random initialization) and finding its step in attempt 1's cache.
    events = ledger.read_events(ledger.ledger_uri(str(tmp_path / fit.name)))
    ends = [(e["attempt"], e["outcome"]) for e in events if e["event"] == "attempt_end"]
    assert ends == [(1, "host-lost"), (2, "succeeded")]
    assert [e["attempt"] for e in events if e["event"] == "initialized"] == [1]
    assert [(e["attempt"], e["step"]) for e in events if e["event"] == "restored"] == [(2, result.start_step)]
    compiled = {e["attempt"]: e for e in events if e["event"] == "compiled"}
    assert compiled[1]["cache_hits"] == 0 and compiled[2]["cache_hits"] >= 1
    account = goodput.account(events)
    assert account.disruptions == 1 and account.last_step == STEPS
    # At most one checkpoint interval of steps was lost, and it is counted as such.
    wasted = account.badput_s[goodput.BadputType.WASTED_PROGRESS_FROM_DISRUPTION]
    longest = max(e["seconds"] for e in events if e["event"] == "step" and e["attempt"] == 1)
    assert 0 <= wasted <= EVERY * longest
    assert account.badput_s[goodput.BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION] > 0


def train_worker_pids() -> list[int]:
    """The Ray Train worker processes now running (Ray titles an actor's process `ray::<class>`)."""
    pids = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(part.startswith("ray::RayTrainWorker") for part in proc.info["cmdline"] or ()):
                pids.append(proc.pid)
    return pids


def test_a_wedged_worker_is_a_hang_and_the_run_resumes_on_a_whole_slice(sim, tmp_path):
    # The bound covers the first step's compile too: 20 s was too tight for four processes compiling
    # at once on a busy 2-core machine (seen: attempt 1 declared hung at 'first batch in').
    steps, timeout = 30, 60
    argv = [
        *("--generation", "v6e", "--topology", "4x4", "--name", "hang", "--storage", str(tmp_path)),
        *("--steps", str(steps), "--checkpoint-every", str(EVERY), "--reserve-timeout", "120"),
        *("--max-preemptions", "1", "--step-timeout", str(timeout), "--learning-rate", "0.02", "--warmup-steps", "1"),
        *TINY,
    ]
    target, config, name, storage, budget = train_config.parse_config(argv)
    outcome: dict = {}
    runner = threading.Thread(
        target=lambda: outcome.setdefault("report", train_fit.run_training(target, config, name, storage, budget, log=lambda line: None)),
        daemon=True,
    )
    runner.start()
    deadline = time.monotonic() + 300
    while newest_checkpoint_step(tmp_path / name) < EVERY and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = train_worker_pids()
    assert runner.is_alive() and len(workers) == SHAPE.hosts, f"no training to wedge: {outcome}, workers {workers}"
    at_stop = newest_checkpoint_step(tmp_path / name)
    wedged = workers[-1]
    os.kill(wedged, signal.SIGSTOP)  # a wedged host: no error, no progress; its peers block on it
    try:
        runner.join(timeout=400)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(wedged, signal.SIGKILL)
    assert not runner.is_alive(), "training did not finish within 400 s of the wedge"
    report = outcome["report"]
    assert report.ok, report.describe()
    first, second = report.attempts
    assert isinstance(first.outcome, HostLost), first.describe()
    assert f"no progress within --step-timeout {timeout}s" in first.outcome.reason
    assert isinstance(second.outcome, Succeeded)
    assert report.value.steps == steps
    assert at_stop <= report.value.start_step < steps  # at most one checkpoint interval lost
