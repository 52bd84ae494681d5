"""Losing a host in the middle of `train`: Ray Train's FailureConfig restarts the whole worker group
on a complete slice (here the host comes back, as GKE recreates a lost TPU VM) from the newest
checkpoint, and the run still ends at the asked step having lost at most one checkpoint interval."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from infra import catalog
from jobs import train

from .sim import SimHost, simulated_cluster, slice_hosts

SHAPE = catalog.shape("v6e", "4x4")
TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "16", "--vocab", "64", "--batch-size", "32"]
STEPS, EVERY = 120, 10


@pytest.fixture(scope="module")
def sim():
    with simulated_cluster(slice_hosts(SHAPE, "sim-ft")) as cluster:
        yield cluster


def newest_checkpoint_step(run_dir: Path) -> int:
    steps = [0]
    for meta in run_dir.glob("checkpoint_*/meta.json"):
        try:
            steps.append(json.loads(meta.read_text())["step"])
        except (OSError, ValueError, KeyError):  # being written right now
            pass
    return max(steps)


def test_a_killed_host_mid_training_restarts_from_the_newest_checkpoint(sim, tmp_path):
    argv = [
        *("--generation", "v6e", "--topology", "4x4", "--name", "ft", "--storage", str(tmp_path)),
        *("--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--max-failures", "1", "--reserve-timeout", "120"),
        *("--learning-rate", "0.02", "--warmup-steps", "1"),
        *TINY,
    ]
    target, config, name, storage, budgets = train.parse_config(argv)
    outcome: dict = {}

    def fit():
        try:
            outcome["result"] = train.run_training(target, config, name, storage, budgets)
        except BaseException as err:  # noqa: BLE001 - asserted below
            outcome["error"] = err

    runner = threading.Thread(target=fit, daemon=True)
    runner.start()
    deadline = time.monotonic() + 300
    while newest_checkpoint_step(tmp_path / name) < EVERY and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runner.is_alive(), f"training ended before the host could be killed: {outcome}"
    at_kill = newest_checkpoint_step(tmp_path / name)
    assert 0 < at_kill < STEPS

    sim.kill_host("sim-ft", 2)
    sim.add_host(SimHost(SHAPE, "sim-ft", 2))  # GKE recreates the VM

    runner.join(timeout=400)
    assert not runner.is_alive(), "training did not finish within 400 s of the host loss"
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert result.steps == STEPS  # what was asked
    # The restarted worker group resumed from a checkpoint no older than the newest one at the kill:
    # at most one checkpoint interval of work was lost.
    assert at_kill <= result.start_step < STEPS
    assert result.processes == SHAPE.hosts
