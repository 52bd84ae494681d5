"""The goodput ledger's writer (jobs.runtime.ledger), local and on gs:// (the GCS emulator), and
`python -m jobs.goodput` reading it as a user would: a run's figures, and one line for a run that
has no ledger."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jobs import REPO_ROOT
from jobs.runtime import ledger, storage
from jobs.runtime.goodput import LedgerError
from tests.jobs.runtime.test_goodput_pure import attempt_events, ev


@pytest.fixture(params=["local", "gs"])
def run_dir(request, tmp_path):
    root = str(tmp_path / "runs") if request.param == "local" else request.getfixturevalue("gcs")
    return storage.join(root, "r1")


def written(run_dir: str, events: list[dict]) -> str:
    writer = ledger.LedgerWriter(ledger.ledger_uri(run_dir))
    for e in events:
        writer.record(e)
    writer.flush()
    return ledger.ledger_uri(run_dir)


def test_the_writer_appends_and_a_rerun_continues_the_same_ledger(run_dir):
    first, t = attempt_events(1, 0.0, range(1, 4), first_s=2.0, step_s=1.0, every=2)
    uri = written(run_dir, [*first, ev(t, "attempt_end", outcome="host-lost")])
    second = [ev(t + 5, "attempt_start", 2), ev(t + 6, "attempt_end", 2, outcome="cancelled")]
    written(run_dir, second)  # a new writer (a rerun of the job) appends to what is there
    events = ledger.read_events(uri)
    assert [e["event"] for e in events[-2:]] == ["attempt_start", "attempt_end"]
    assert len(events) == len(first) + 3


def test_a_cut_last_line_is_left_out_and_a_bad_line_is_named():
    good = json.dumps({"t": 1.0, "event": "attempt_start", "attempt": 1})
    assert ledger.parse(good + "\n" + '{"t": 2.0, "ev', "x") == [json.loads(good)]
    with pytest.raises(LedgerError, match="x line 1 is not JSON"):
        ledger.parse("nonsense\n" + good + "\n", "x")


def goodput_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.goodput", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def test_python_m_jobs_goodput_prints_a_runs_figures_and_timeline(tmp_path):
    events, t = attempt_events(1, 1000.0, range(1, 11), first_s=5.0, step_s=1.0, every=5)
    written(storage.join(str(tmp_path), "r1"), [*events, ev(t + 1, "attempt_end", outcome="succeeded")])
    out = goodput_cli("--storage", str(tmp_path), "--name", "r1")
    assert out.returncode == 0, out.stderr
    assert "goodput" in out.stdout and "PROGRAM_STARTUP" in out.stdout and "attempt 1: start 0.0 s" in out.stdout
    figures = json.loads(goodput_cli("--storage", str(tmp_path), "--name", "r1", "--json").stdout)
    assert figures["attempts"] == 1 and figures["last_step"] == 10
    assert figures["productive_s"] + sum(figures["badput_s"].values()) == pytest.approx(figures["wall_s"])


def test_python_m_jobs_goodput_of_a_run_that_does_not_exist_is_one_line(tmp_path):
    out = goodput_cli("--storage", str(tmp_path), "--name", "never-ran")
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "never-ran" in out.stderr and "does not exist" in out.stderr
