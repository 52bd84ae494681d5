"""`jobs.batch` for real, on a simulated v4 2x2x2 slice (two hosts, so two vLLM CPU engines) that
`.venv-serve/bin/python -m jobs.local up` starts (its hosts run that venv's Python, where vLLM is),
submitted with `ray job submit` as every job is:

- greedy completions equal `vllm.LLM.generate`'s for the same prompts and model, row by row, ids
  kept (the tiny random Llama jobs.serve makes: float32, eager, as serving runs on CPU);
- a job stopped mid-run (`ray job stop`): the rerun with the same --output sends the engines only
  the rows not committed (the summary's `requests`), and every input row is in the output once;
- a host killed mid-run: the run carries on with the engine left or stops (exit 1), never hangs; a
  rerun then completes it, every input row exactly once.

Minutes each (vLLM engines start on 2 cores): `make test-slow`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[3]
SERVE_PYTHON = REPO / ".venv-serve" / "bin" / "python"
SERVE_RAY = REPO / ".venv-serve" / "bin" / "ray"
MODEL = REPO / "build" / "serve" / "tiny-llama"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.cluster,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not (REPO / ".venv-serve" / ".installed").is_file(), reason=".venv-serve is not installed: run scripts/setup_serve_env.sh"
    ),
]


def serve_run(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SERVE_PYTHON), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


@pytest.fixture(scope="module")
def sim():
    """A jobs.local cluster of one v4 2x2x2 slice on .venv-serve's Python; its client settings."""
    made = serve_run("-c", "from jobs.serve.local import ensure_model; ensure_model()")
    assert made.returncode == 0, made.stderr
    state = Path(tempfile.mkdtemp(prefix="jb-", dir="/tmp"))
    up = serve_run("-m", "jobs.local", "up", "--generation", "v4", "--topology", "2x2x2", "--host-cpus", "3", "--state-dir", str(state))
    assert up.returncode == 0, up.stderr[-2000:]
    exports = serve_run("-m", "jobs.local", "env", "--state-dir", str(state)).stdout
    client = dict(line.removeprefix("export ").split("=", 1) for line in exports.splitlines())
    try:
        yield state, {k: v.strip("'") for k, v in client.items()}
    finally:
        serve_run("-m", "jobs.local", "down", "--state-dir", str(state))
        shutil.rmtree(state, ignore_errors=True)


def prompts_file(tmp_path: Path, n: int) -> tuple[Path, list[str], list[str]]:
    ids = [f"q-{i:05d}" for i in range(n)]  # zero-padded: sorted ids are in input order
    texts = [f"Question {i}: the next numbers after {i} are" for i in range(n)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": k, "prompt": t}) + "\n" for k, t in zip(ids, texts, strict=True)))
    return path, ids, texts


def submit(client: dict, *job_args: str, wait: bool = True, submission_id: str | None = None) -> subprocess.CompletedProcess:
    args = [str(SERVE_RAY), "job", "submit", *(("--submission-id", submission_id) if submission_id else ())]
    args += [*(() if wait else ("--no-wait",)), "--", "python", "-m", "jobs.batch", "--generation", "v4", "--topology", "2x2x2", *job_args]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, **client})


def read_output(out: Path) -> list[dict]:
    rows = []
    for shard in sorted(out.glob("shard-*.parquet")):
        rows += pq.read_table(shard).to_pylist()
    return rows


def test_greedy_completions_equal_vllms_own_generate_row_by_row(sim, tmp_path):
    _, client = sim
    data, ids, texts = prompts_file(tmp_path, 24)
    out = tmp_path / "out"
    ran = submit(client, "--model", str(MODEL), "--data", str(data), "--output", str(out), "--max-tokens", "12", "--shard-rows", "5")
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert "2 vLLM engine(s), one per host" in ran.stdout
    summary = json.loads(next(line for line in ran.stdout.splitlines() if line.startswith("BATCH ")).removeprefix("BATCH "))
    assert summary["written"] == 5 and summary["requests"] == 24 and summary["engines"] == 2

    (tmp_path / "prompts.json").write_text(json.dumps(texts))
    base = serve_run("tests/jobs/batch/vllm_generate.py", str(MODEL), str(tmp_path / "prompts.json"), "12", "0", str(tmp_path / "v.json"))
    assert base.returncode == 0, base.stderr[-3000:]
    expected = json.loads((tmp_path / "v.json").read_text())["rows"]
    got = read_output(out)
    assert [r["id"] for r in got] == ids and [r["prompt"] for r in got] == texts
    for row, want in zip(got, expected, strict=True):
        assert (row["completion"], row["completion_tokens"], row["finish_reason"]) == (
            want["completion"],
            want["completion_tokens"],
            want["finish_reason"],
        ), row["id"]
        assert row["prompt_tokens"] > 0


def job_status(client: dict, submission_id: str) -> str:
    """The job's status as `ray job status` prints it ("Status for job '...': RUNNING" while it runs;
    "Job '...' failed" / "succeeded" / "was stopped" once it has ended), lower-cased."""
    return subprocess.run(
        [str(SERVE_RAY), "job", "status", submission_id], capture_output=True, text=True, env={**os.environ, **client}, timeout=60
    ).stdout.lower()


def wait_for_end(client: dict, submission_id: str, deadline: float) -> str:
    status = ""
    while time.monotonic() < deadline:
        status = job_status(client, submission_id)
        for end, said in (("succeeded", "succeeded"), ("failed", "failed"), ("stopped", "was stopped")):
            if f"job '{submission_id}' {said}" in status:  # ray's cli.py, _log_job_status
                return end
        time.sleep(2)
    raise AssertionError(f"{submission_id} did not end in time: {status[-2000:]}")  # never hung


def wait_for_shards(out: Path, count: int, deadline: float) -> None:
    while len(list(out.glob("shard-*.parquet"))) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(list(out.glob("shard-*.parquet"))) >= count, "no shard committed in time"


def committed_rows(out: Path) -> tuple[set[str], int]:
    names = {p.name for p in out.glob("shard-*.parquet")}
    return names, sum(pq.read_metadata(out / name).num_rows for name in names)


def rerun_completes(client: dict, flags: tuple[str, ...], out: Path, ids: list[str]) -> dict:
    """The same command again: it sends the engines only the rows not committed, and afterwards
    every input row is in the output exactly once, with nothing but the shards there."""
    before, rows_before = committed_rows(out)
    rerun = submit(client, *flags)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-2000:]
    summary = json.loads(next(line for line in rerun.stdout.splitlines() if line.startswith("BATCH ")).removeprefix("BATCH "))
    assert summary["requests"] == len(ids) - rows_before and summary["skipped"] == len(before)
    assert sorted(r["id"] for r in read_output(out)) == ids  # every input row, exactly once
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in out.glob("shard-*.parquet"))  # only the shards
    return summary


# Long enough that a stop or a lost host lands mid-run: each engine runs 512 rows at once (8 blocks of
# 64) and schedules 256 of them a step, so rows come back in bursts of 256 a few seconds apart (96
# tokens: about 4 s on 2 cores). 2048 prompts of 128 tokens are four bursts per engine: after the
# first shard, three are left, over ten seconds.
LONG_ROWS, LONG_FLAGS = 2048, ("--max-tokens", "128", "--shard-rows", "4")


def start_batch(client: dict, tmp_path: Path, rows: int, submission_id: str, *more: str) -> tuple[list[str], Path, tuple[str, ...]]:
    """A batch job of `rows` prompts submitted without waiting: the input ids, its --output, its flags."""
    data, ids, _ = prompts_file(tmp_path, rows)
    out = tmp_path / "out"
    flags = ("--model", str(MODEL), "--data", str(data), "--output", str(out), *more)
    first = submit(client, *flags, wait=False, submission_id=submission_id)
    assert first.returncode == 0, first.stderr
    return ids, out, flags


def test_a_job_stopped_mid_run_is_finished_by_a_rerun_that_sends_only_the_rest(sim, tmp_path):
    _, client = sim
    ids, out, flags = start_batch(client, tmp_path, LONG_ROWS, "batch-stopped", *LONG_FLAGS)
    deadline = time.monotonic() + 600
    wait_for_shards(out, 1, deadline)
    stop = subprocess.run(
        [str(SERVE_RAY), "job", "stop", "--no-wait", "batch-stopped"], capture_output=True, text=True, env={**os.environ, **client}
    )
    assert stop.returncode == 0, stop.stderr
    assert wait_for_end(client, "batch-stopped", deadline) == "stopped"
    time.sleep(5)  # the driver's process group gone (Ray stops it after the status is set)
    _, rows_before = committed_rows(out)
    summary = rerun_completes(client, flags, out, ids)
    assert 0 < summary["requests"] == len(ids) - rows_before < len(ids)  # only the rows left were sent


def test_a_host_killed_mid_run_loses_no_row_and_a_rerun_finishes_what_is_left(sim, tmp_path):
    state, client = sim
    ids, out, flags = start_batch(client, tmp_path, LONG_ROWS, "batch-killed", *LONG_FLAGS)
    deadline = time.monotonic() + 600
    wait_for_shards(out, 1, deadline)
    killed = serve_run("-m", "jobs.local", "kill-host", "--state-dir", str(state), "--slice", "0", "--host", "1", "--back-after", "2")
    assert killed.returncode == 0, killed.stderr
    ended = wait_for_end(client, "batch-killed", deadline)  # it carried on, or stopped: never hung
    assert ended in ("succeeded", "failed")
    if ended == "succeeded":  # carried on with the engine left: all of it, each row once
        assert sorted(r["id"] for r in read_output(out)) == ids
    deadline = time.monotonic() + 120  # the slice whole again (the fresh host registered)
    while serve_run("-m", "jobs.local", "status", "--state-dir", str(state)).returncode != 0 and time.monotonic() < deadline:
        time.sleep(2)
    rerun_completes(client, flags, out, ids)


def test_the_printed_batch_rayjob_runs_on_the_simulated_slice(tmp_path):
    """`jobs.submit batch --print-rayjob` as a user applies it, run by `.venv-serve/bin/python -m
    jobs.local rayjob` (KubeRay's controller, simulated) on a v6e 2x2 slice of its shape."""
    data, ids, _ = prompts_file(tmp_path, 6)
    out = tmp_path / "out"
    env_file = tmp_path / "env.yaml"
    env_file.write_text(
        "project: my-gcp-project\nregion: us-east5\nzone: us-east5-b\ncluster_name: rj\n"
        "slice_groups: [{name: v6e-2x2, generation: v6e, topology: 2x2, rayjob_slices: 1}]\n"
    )
    serve = "us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-serve-tpu@sha256:" + "cd" * 32
    printed = serve_run(
        *("-m", "jobs.submit", "batch", "--env", str(env_file), "--serve-image", serve, "--print-rayjob", "--name", "bj", "--"),
        *("--model", str(MODEL), "--data", str(data), "--output", str(out), "--max-tokens", "6", "--shard-rows", "4"),
    )
    assert printed.returncode == 0, printed.stderr
    job = tmp_path / "bj.yaml"
    job.write_text(printed.stdout)
    state = Path(tempfile.mkdtemp(prefix="jr-", dir="/tmp"))
    try:
        done = serve_run("-m", "jobs.local", "--state-dir", str(state), "rayjob", str(job), timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "bj: Complete" in done.stdout and "BATCH {" in done.stdout
    finally:
        serve_run("-m", "jobs.local", "down", "--state-dir", str(state))
        shutil.rmtree(state, ignore_errors=True)
    assert sorted(r["id"] for r in read_output(out)) == ids
