"""Checkpoints are whole or not used: a process SIGKILLed in the middle of writing one leaves the
previous one usable (and picked), a copy cut short is refused with the reason, and a rerun that
reaches a step again writes beside the old checkpoint. No Ray cluster: Ray Train's `Checkpoint` on
the local filesystem, real numpy, real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from jobs import REPO_ROOT
from jobs.train import checkpoints
from jobs.train.checkpoints import IncompleteCheckpointError

MODEL = {"vocab": 64, "d_model": 32}


def arrays(step: int, size: int = 1000) -> list[np.ndarray]:
    return [np.full(size, step, np.float32), np.arange(size, dtype=np.int64) * step]


def test_a_written_checkpoint_loads_back_and_records_its_digest(tmp_path):
    meta = checkpoints.write(tmp_path / "c", arrays(7), 7, MODEL)
    assert (meta.step, meta.model) == (7, MODEL) and meta.state_bytes > 0 and len(meta.state_sha256) == 64
    loaded_meta, loaded = checkpoints.load(tmp_path / "c")
    assert loaded_meta == meta
    assert all(np.array_equal(a, b) for a, b in zip(loaded, arrays(7), strict=False))
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [checkpoints.META_FILE, checkpoints.STATE_FILE]


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import numpy as np
    from jobs.train import checkpoints

    root = Path(sys.argv[1])
    checkpoints.write(root / "older", [np.full(1000, 10, np.float32)], 10, {"vocab": 64})
    print("older written", flush=True)
    # Big enough that the write takes a while: the test kills this process in the middle of it.
    big = [np.random.default_rng(0).random(2**21) for _ in range(64)]
    checkpoints.write(root / "newer", big, 20, {"vocab": 64})
    print("newer written", flush=True)
    """
)


def test_a_process_killed_mid_write_leaves_the_previous_checkpoint_usable(tmp_path):
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    try:
        assert writer.stdout.readline().strip() == "older written"
        partial = tmp_path / "newer" / f".{checkpoints.STATE_FILE}.partial"
        deadline = time.monotonic() + 60
        while not (partial.exists() and partial.stat().st_size > 2**20) and time.monotonic() < deadline:
            time.sleep(0.001)
        writer.send_signal(signal.SIGKILL)  # mid-write: a megabyte of the state is on disk
        writer.wait(timeout=30)
    finally:
        writer.kill()
    assert writer.returncode == -signal.SIGKILL
    assert not (tmp_path / "newer" / checkpoints.META_FILE).exists(), "the write finished before the kill"

    with pytest.raises(IncompleteCheckpointError, match="has no meta.json: its write never finished"):
        checkpoints.load(tmp_path / "newer")
    skipped: list[str] = []
    found = checkpoints.newest_whole([(name, lambda name=name: _local(tmp_path / name)) for name in ("newer", "older")], skipped.append)
    assert found is not None
    meta, loaded, name = found
    assert (name, meta.step) == ("older", 10) and np.array_equal(loaded[0], np.full(1000, 10, np.float32))
    assert len(skipped) == 1 and skipped[0].startswith("skipping checkpoint newer: ")


def _local(path: Path):
    return contextlib.nullcontext(str(path))


@pytest.mark.parametrize(
    "damage, reason",
    [
        pytest.param(lambda state: state.write_bytes(state.read_bytes()[:100]), "is 100 bytes, but meta.json says", id="truncated"),
        pytest.param(lambda state: state.unlink(), "is missing, but meta.json says", id="state-missing"),
        pytest.param(lambda state: state.write_bytes(bytes(state.stat().st_size)), "bytes with another digest", id="same-size-other-bytes"),
        pytest.param(lambda state: (state.parent / "meta.json").write_text("{"), "meta.json is unreadable", id="meta-cut-short"),
    ],
)
def test_a_copy_cut_short_is_refused_with_the_reason(tmp_path, damage, reason):
    directory = tmp_path / checkpoints.dir_name(20)
    checkpoints.write(directory, arrays(20), 20, MODEL)
    damage(directory / checkpoints.STATE_FILE)
    with pytest.raises(IncompleteCheckpointError, match=reason):
        checkpoints.load(directory)


def test_the_runs_stored_checkpoints_are_tried_newest_step_first_and_a_bad_one_is_skipped(tmp_path):
    run = tmp_path / "storage" / "run"
    names = {step: checkpoints.dir_name(step) for step in (10, 20, 30)}
    for step, name in names.items():
        checkpoints.write(run / name, arrays(step), step, MODEL)
    (run / "checkpoint_manager_snapshot.json").write_text("{}")  # Ray Train's own files are not candidates
    (run / "checkpoint_2026-12-03_08-00-00.000000").mkdir()  # nor are directories named otherwise
    newest = run / names[30] / checkpoints.STATE_FILE
    newest.write_bytes(newest.read_bytes()[:-10])

    candidates = checkpoints.stored_candidates(str(tmp_path / "storage"), "run")
    assert [checkpoints.step_of(name) for name, _ in candidates] == [30, 20, 10]
    skipped: list[str] = []
    meta, loaded, name = checkpoints.newest_whole(candidates, skipped.append)
    assert meta.step == 20 and checkpoints.step_of(name) == 20
    assert np.array_equal(loaded[0], arrays(20)[0])
    assert len(skipped) == 1 and "a write or copy that was cut short" in skipped[0]
    assert checkpoints.stored_candidates(str(tmp_path / "storage"), "no-such-run") == []


def test_directory_names_sort_by_step_and_a_step_reached_again_gets_a_new_one():
    first, again = checkpoints.dir_name(120), checkpoints.dir_name(120)
    assert first != again and checkpoints.step_of(first) == checkpoints.step_of(again) == 120
    names = [checkpoints.dir_name(s, "t") for s in (9, 100, 1000)]
    assert sorted(names) == names
    assert checkpoints.step_of("checkpoint_2026-12-03_08-00-00.000000") is None
    assert checkpoints.step_of(checkpoints.dir_name(5, "ab12")) == 5
