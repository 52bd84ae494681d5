"""`python -m jobs.client.submitter --entrypoint CMD [--runtime-env-json JSON]`: a RayJob's submitter
(K8sJobMode: the pod of the Job KubeRay makes; infra.manifests.rayjob says why this one and not
KubeRay's own). It submits the job once, follows its logs, and ends only when Ray says the job ended.

- KubeRay gives it `RAY_DASHBOARD_ADDRESS` (host:port of the head's dashboard), `RAY_JOB_SUBMISSION_ID`
  and, with token auth, `RAY_AUTH_MODE` / `RAY_AUTH_TOKEN` (infra.kube_facts "submitter-token").
- Submit once: a job already under that id (a retried pod of the Job) is followed, not submitted
  again, as KubeRay's own submitter checks with `ray job status` first.
- Follow: the logs stream over the dashboard's websocket. When the stream ends while Ray still says
  the job runs (a dropped connection, a busy head: kuberay#4921), it says so and follows again,
  printing only what it had not printed. KubeRay fails a RayJob 30 s after its submitter ends while
  the job runs, so ending early is never the answer.
- Bounded: the dashboard must answer within `--wait-timeout` at the start, and a status read must
  succeed at least once every `--unreachable-timeout` (KubeRay's own status-check timeout, 300 s,
  utils/constant.go:284-290); past either, it says what it waited for and exits 1.

Exit 0 once the job is SUCCEEDED, FAILED or STOPPED (KubeRay reads the result from Ray, as it does
from its own submitter), 1 when it could not submit or lost the dashboard, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from jobs.client.jobs_api import TERMINAL, SubmitError, bounded_client, submit_job
from jobs.runtime.deadlines import Deadline

WAIT_S = 900.0
UNREACHABLE_S = 300.0
RETRY_S = (1.0, 2.0, 5.0, 10.0)  # between reconnects, growing


def say(text: str) -> None:
    print(f"[submitter] {text}", flush=True)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


class Follower:
    """The job's log as printed so far: a reconnected stream replays from the start, and what was
    already printed is skipped."""

    def __init__(self, write: Callable[[str], None]):
        self.write, self.printed = write, 0

    def feed(self, seen: int, chunk: str) -> int:
        """`chunk` arrived at offset `seen` of this stream; print what is new. The new offset."""
        end = seen + len(chunk)
        if end > self.printed:
            self.write(chunk[max(0, self.printed - seen) :])
            self.printed = end
        return end


async def _stream(client: Any, job_id: str, follower: Follower) -> None:
    seen = 0
    async for chunk in client.tail_job_logs(job_id):
        seen = follower.feed(seen, chunk)


def status_of(client: Any, job_id: str) -> str | None:
    """Ray's status of the job, or None when it does not exist."""
    try:
        status = client.get_job_status(job_id)
    except RuntimeError as err:
        if "does not exist" in str(err):
            return None
        raise
    return str(getattr(status, "value", status))


def wait_for_dashboard(address: str, timeout_s: float) -> Any:
    """A bounded Jobs API client once the dashboard answers (KubeRay's submitter waits on the GCS
    health endpoint the same way, common/job.go:132-152)."""
    deadline, last = Deadline(timeout_s), ""
    while True:
        try:
            return bounded_client(address)
        except Exception as err:  # refused, stalled, not ready yet: all retried until the bound
            last = " ".join(str(err).split()) or type(err).__name__
        if deadline.expired():
            raise SubmitError(f"the Ray dashboard at {address} did not answer within {timeout_s:g} s ({last})")
        deadline.sleep(2.0)


def run(address: str, job_id: str, entrypoint: str, runtime_env: dict[str, Any], wait_s: float, unreachable_s: float) -> int:
    client = wait_for_dashboard(address, wait_s)
    found = status_of(client, job_id)
    if found is None:
        submit_job(client, entrypoint, runtime_env, submission_id=job_id)
        say(f"submitted job {job_id} to {address}: {entrypoint}")
    else:
        say(f"job {job_id} is already there ({found}): following it, not submitting it again")
    follower = Follower(_write)
    last_read, retries = time.monotonic(), 0
    while True:
        why = "its log stream ended"
        try:
            asyncio.run(_stream(client, job_id, follower))
        except Exception as err:  # a dropped websocket: aiohttp's or Ray's error, whichever
            why = f"its log stream broke ({' '.join(str(err).split()) or type(err).__name__})"
        try:
            status = status_of(client, job_id)
            last_read = time.monotonic()
        except Exception as err:
            status = f"unknown ({' '.join(str(err).split()) or type(err).__name__})"
            if time.monotonic() - last_read > unreachable_s:
                say(f"could not read job {job_id}'s status for {unreachable_s:g} s: {status}; giving up")
                return 1
        if status in TERMINAL:
            say(f"job {job_id} {status}")
            return 0
        if status is None:
            say(f"job {job_id} is gone from the cluster ({why}); giving up")
            return 1
        pause = RETRY_S[min(retries, len(RETRY_S) - 1)]
        say(f"{why} while job {job_id} is {status}: following it again in {pause:g} s")
        retries += 1
        time.sleep(pause)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.client.submitter", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entrypoint", required=True, help="the job's shell command (the RayJob's entrypoint)")
    parser.add_argument("--runtime-env-json", default="{}", metavar="JSON", help="the job's runtime env (the RayJob's runtimeEnvYAML)")
    parser.add_argument(
        "--wait-timeout", type=float, default=WAIT_S, metavar="SECONDS", help=f"for the dashboard to answer (default {WAIT_S:g})"
    )
    parser.add_argument(
        "--unreachable-timeout",
        type=float,
        default=UNREACHABLE_S,
        metavar="SECONDS",
        help=f"without a status read (default {UNREACHABLE_S:g})",
    )
    args = parser.parse_args(argv)
    try:
        args.runtime_env = json.loads(args.runtime_env_json)
    except ValueError as err:
        parser.error(f"--runtime-env-json: not JSON ({err})")
    if not isinstance(args.runtime_env, dict):
        parser.error("--runtime-env-json: a runtime env is a JSON object")
    for name in ("RAY_DASHBOARD_ADDRESS", "RAY_JOB_SUBMISSION_ID"):
        if not os.environ.get(name):
            parser.error(f"{name} is not set: KubeRay sets it on a RayJob's submitter (rayjob_controller.go:649-656)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    address = os.environ["RAY_DASHBOARD_ADDRESS"]
    address = address if "://" in address else f"http://{address}"
    try:
        return run(
            address, os.environ["RAY_JOB_SUBMISSION_ID"], args.entrypoint, args.runtime_env, args.wait_timeout, args.unreachable_timeout
        )
    except SubmitError as err:
        say(f"error: {' '.join(str(err).split())}")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
