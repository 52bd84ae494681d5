"""Orbax checkpoints (jobs.train.checkpoints) in real processes with a state sharded over 4 CPU
devices: saved asynchronously and kept to the newest two, restored shard by shard onto the same
sharding (or the parameters alone onto one device), never into another model, a checkpoint damaged
after its commit skipped for the one before, and a process SIGKILLed in the middle of a save leaves
the previous checkpoint in use. The multi-host case (every host writing its own shards) runs on the
simulated slice in test_fit.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from jobs import REPO_ROOT
from jobs.train import checkpoints


def worker(phase: str, root: Path, timeout_s: float = 120) -> dict:
    """Run tests/jobs/train/checkpoint_worker.py's `phase`; its last JSON line."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.jobs.train.checkpoint_worker", phase, str(root)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_saved_asynchronously_kept_to_two_and_restored_onto_the_same_sharding(tmp_path):
    assert worker("save", tmp_path) == {"saved": [6, 9]}  # step 3 deleted by Orbax's retention
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoints.dir_name(6), checkpoints.dir_name(9)]

    got = worker("restore", tmp_path)
    assert (got["step"], got["embed"], got["skipped"]) == (9, 9.0, [])
    assert got["embed_spec"] == "P('fsdp',)"  # placed shard by shard, as the run shards it
    assert got["opt_type"] == "tuple" and got["adam_count"] == 0  # optax's own tree, not Orbax's lists
    assert got["alone_devices"] == 1 and got["alone_opt_state"] is None  # what jobs.export reads

    refused = worker("mismatch", tmp_path)["refused"]
    assert "is of another model" in refused and "pass another --name" in refused


def test_a_checkpoint_damaged_after_its_commit_is_skipped_and_deleted(tmp_path):
    worker("save", tmp_path)
    newest = tmp_path / checkpoints.dir_name(9) / "params"
    for data in [p for p in newest.rglob("*") if p.is_file() and p.parent.name == "d"]:
        data.write_bytes(data.read_bytes()[:10])  # cut short, as by a copy killed half-way
    got = worker("restore", tmp_path)
    assert got["step"] == 6 and got["embed"] == 6.0
    assert len(got["skipped"]) == 1 and got["skipped"][0].startswith(f"skipping checkpoint {tmp_path}/{checkpoints.dir_name(9)}: ")
    assert "its arrays do not read back" in got["skipped"][0]
    assert got["entries"] == [checkpoints.dir_name(6)]  # the run writes step 9 again


def test_a_process_killed_mid_save_leaves_the_previous_checkpoint_in_use(tmp_path):
    saver = subprocess.Popen(
        [sys.executable, "-m", "tests.jobs.train.checkpoint_worker", "kill", str(tmp_path)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert json.loads(saver.stdout.readline()) == {"committed": 10}
        assert json.loads(saver.stdout.readline()) == {"saving": 20}
        # Killed while the background write is on disk but not committed: Orbax writes under a
        # temporary name and renames only at the commit.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _partial_bytes(tmp_path) > 2**20:
            time.sleep(0.005)
        saver.send_signal(signal.SIGKILL)
        saver.wait(timeout=30)
    finally:
        saver.kill()
    assert saver.returncode == -signal.SIGKILL
    assert _partial_bytes(tmp_path) > 2**20, "no save in flight at the kill"
    assert not (tmp_path / checkpoints.dir_name(20)).exists(), "the save committed before the kill"

    got = worker("restore", tmp_path)
    assert got["steps"] == [10] and got["step"] == 10 and got["embed"] == 10.0
    assert got["entries"] == [checkpoints.dir_name(10)]  # the killed save's leftovers are cleaned up


def _partial_bytes(root: Path) -> int:
    """Bytes under the temporary directories of saves not yet committed."""
    return sum(
        p.stat().st_size for d in root.glob(f"{checkpoints.STEP_PREFIX}_*.orbax-checkpoint-tmp*") for p in d.rglob("*") if p.is_file()
    )


def test_directory_names_sort_by_step_and_the_run_directory_is_ray_trains():
    names = [checkpoints.dir_name(s) for s in (9, 100, 1000)]
    assert sorted(names) == names and [checkpoints.step_of(n) for n in names] == [9, 100, 1000]
    assert checkpoints.step_of("checkpoint_2026-12-03_08-00-00.000000") is None  # Ray Train's own names
    assert checkpoints.step_of(f"{checkpoints.dir_name(5)}.orbax-checkpoint-tmp-1") is None
    assert checkpoints.run_root("gs://bucket/ray-train/", "run") == "gs://bucket/ray-train/run"
    assert checkpoints.run_root("rel", "run") == os.path.abspath("rel") + "/run"
