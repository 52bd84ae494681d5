"""Every Jobs API request is bounded: real local servers stand in for a Ray dashboard that accepts
connections and then goes quiet, and jobs.submit / jobs.demo must give up within the bound, with one
line naming the request and the address, stopping the job where one exists. No Ray cluster needed."""

from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jobs import REPO_ROOT as REPO
from jobs import demo
from jobs.client import jobs_api

BOUND_S = 1.0  # per-request bound the tests use: long enough for loopback, short enough to wait for
STALL = "stall"  # a route action: read the request, never answer


@pytest.fixture(autouse=True)
def no_ray_address(monkeypatch):
    # Ray's client lets these override the address it is given; a developer's shell may set them.
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)


@contextlib.contextmanager
def stalled_server():
    """A TCP server on 127.0.0.1 that accepts connections and never answers; yields its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)  # so the accept loop notices `done` (closing does not wake accept())
    done, held = threading.Event(), []

    def accept_until_done() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept_until_done, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        done.set()
        thread.join(5)
        listener.close()
        for conn in held:
            conn.close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet: pytest shows stderr on failure
        pass

    def _route(self) -> None:
        server: FakeDashboard = self.server
        key = f"{self.command} {self.path}"
        server.seen.append(key)
        action = next((a for pattern, a in server.routes.items() if fnmatch.fnmatchcase(key, pattern)), None)
        if callable(action):
            payload = action(self)
        else:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if action == STALL:
                server.released.wait(60)  # released at teardown; 60 s caps it if teardown never comes
                return
            payload = action
        if payload is None:
            self.send_error(404)
            return
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = _route


class FakeDashboard(ThreadingHTTPServer):
    """A Ray dashboard stand-in on 127.0.0.1. `routes` maps `METHOD /path` patterns (fnmatch, first
    match wins) to a dict sent as JSON, STALL, or a callable(handler) returning the dict; the version
    check is answered. Every request seen is in `seen`."""

    daemon_threads = True

    def __init__(self, routes: dict):
        import ray

        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes = {"GET /api/version": {"ray_version": ray.__version__}, **routes}
        self.seen: list[str] = []
        self.released = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextlib.contextmanager
def fake_dashboard(routes: dict):
    server = FakeDashboard(routes)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.released.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def accept_submission(handler) -> dict:
    """POST /api/jobs/: take the client's submission id, as Ray does."""
    body = json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))
    return {"job_id": None, "submission_id": body["submission_id"]}


def job_details(status: str) -> dict:
    return {"type": "SUBMISSION", "status": status, "entrypoint": "python -m jobs.healthcheck"}


STOPPED = {"stopped": True}


def test_the_constructor_gives_up_on_a_stalled_dashboard():
    with stalled_server() as url:
        started = time.monotonic()
        with pytest.raises(jobs_api.DashboardStalled) as err:
            jobs_api.bounded_client(url, connect_s=BOUND_S, read_s=BOUND_S)
        elapsed = time.monotonic() - started
    assert elapsed < 5, elapsed
    assert str(err.value) == f"the Ray dashboard at {url} did not answer GET /api/version within 1 s"


def test_follow_gives_up_on_a_stall_and_stops_the_job():
    routes = {"POST /api/jobs/*/stop": STOPPED, "GET /api/jobs/*": STALL}
    with fake_dashboard(routes) as dash:
        client = jobs_api.bounded_client(dash.url, connect_s=BOUND_S, read_s=BOUND_S)
        started = time.monotonic()
        with pytest.raises(TimeoutError) as err:  # a TimeoutError: `python -m jobs.submit` exits 3
            jobs_api.follow(client, "raysubmit_abc", timeout_s=600, poll_s=0.1, out=io.StringIO())
        elapsed = time.monotonic() - started
    assert elapsed < 5, elapsed
    assert str(err.value) == (
        f"the Ray dashboard at {dash.url} did not answer GET /api/jobs/raysubmit_abc within 1 s "
        "while following job raysubmit_abc; it was stopped"
    )
    assert "POST /api/jobs/raysubmit_abc/stop" in dash.seen


def test_a_stalled_stop_is_bounded_too():
    with fake_dashboard({"* /api/jobs/*": STALL}) as dash:
        client = jobs_api.bounded_client(dash.url, connect_s=BOUND_S, read_s=BOUND_S)
        started = time.monotonic()
        with pytest.raises(jobs_api.JobTimedOut) as err:
            jobs_api.follow(client, "raysubmit_abc", timeout_s=600, poll_s=0.1, out=io.StringIO())
        elapsed = time.monotonic() - started
    assert elapsed < 8, elapsed  # the status request's bound, then the stop's
    assert str(err.value).endswith(
        f"stopping it failed too (the Ray dashboard at {dash.url} did not answer POST /api/jobs/raysubmit_abc/stop "
        "within 1 s); it may still be running"
    )


def test_a_submission_whose_answer_stalls_is_stopped():
    routes = {"POST /api/jobs/": STALL, "POST /api/jobs/*/stop": STOPPED}
    with fake_dashboard(routes) as dash:
        client = jobs_api.bounded_client(dash.url, connect_s=BOUND_S, read_s=BOUND_S)
        started = time.monotonic()
        with pytest.raises(jobs_api.SubmitError) as err:  # not a timeout: nothing was followed (exit 2)
            jobs_api.submit_job(client, "python -m jobs.healthcheck", {}, submission_id="raysubmit_abc")
        elapsed = time.monotonic() - started
    assert elapsed < 5, elapsed
    assert not isinstance(err.value, TimeoutError)
    assert str(err.value) == (
        f"the Ray dashboard at {dash.url} did not answer POST /api/jobs/ within 1 s; "
        "job raysubmit_abc may have started anyway: it was stopped"
    )


def test_a_slow_upload_that_keeps_moving_gets_through():
    """The bound is per socket operation: a body that takes longer than the bound to send, but keeps
    moving, is not cut off (a whole-body sendall() would be)."""
    size = 16 * 1024 * 1024

    def read_slowly(handler) -> dict:
        left = int(handler.headers["Content-Length"])
        while left:
            left -= len(handler.rfile.read(min(left, 64 * 1024)))
            time.sleep(0.01)  # ~6 MB/s: the whole body takes over twice the bound
        return {}

    with fake_dashboard({"PUT /api/packages/*": read_slowly}) as dash:
        client = jobs_api.bounded_client(dash.url, connect_s=BOUND_S, read_s=BOUND_S)
        started = time.monotonic()
        response = client._do_request("PUT", "/api/packages/gcs/_ray_pkg_test.zip", data=b"x" * size)
        elapsed = time.monotonic() - started
    assert response.status_code == 200
    assert elapsed > 1.5 * BOUND_S, f"the upload took {elapsed:.1f} s: too fast to show anything"


def test_demo_run_job_filters_prefixes_and_parses_through_the_shared_loop():
    logs = 'starting\n[Gloo] Rank 0 is connected\nHEALTHCHECK {"ok": true, "devices": 4}\ndone\n'
    routes = {"POST /api/jobs/": accept_submission, "GET /api/jobs/*/logs": {"logs": logs}, "GET /api/jobs/*": job_details("SUCCEEDED")}
    echoed: list[str] = []
    with fake_dashboard(routes) as dash:
        client = jobs_api.bounded_client(dash.url, connect_s=BOUND_S, read_s=BOUND_S)
        outcome = demo.run_job(client, "healthcheck", "python -m jobs.healthcheck", {}, "HEALTHCHECK", 30, echoed.append)
    assert outcome.status == "SUCCEEDED" and outcome.ok
    assert outcome.job_id.startswith("demo-healthcheck-")
    assert outcome.result == {"ok": True, "devices": 4}
    assert echoed == ["[healthcheck] starting", "[healthcheck] done"]


def test_demo_run_job_reports_a_stall_and_stops_the_job():
    routes = {"POST /api/jobs/": accept_submission, "POST /api/jobs/*/stop": STOPPED, "GET /api/jobs/*": STALL}
    with fake_dashboard(routes) as dash:
        client = jobs_api.bounded_client(dash.url, connect_s=BOUND_S, read_s=BOUND_S)
        started = time.monotonic()
        outcome = demo.run_job(client, "healthcheck", "python -m jobs.healthcheck", {}, "HEALTHCHECK", 600, print)
        elapsed = time.monotonic() - started
    assert elapsed < 5, elapsed
    assert not outcome.ok and outcome.result is None
    assert outcome.status.startswith(f"TIMED OUT: the Ray dashboard at {dash.url} did not answer GET /api/jobs/demo-healthcheck-")
    assert outcome.status.endswith("; it was stopped")
    assert f"POST /api/jobs/{outcome.job_id}/stop" in dash.seen


class FakeClient:
    """Just enough of JobSubmissionClient for the follow loop's own logic."""

    def __init__(self, statuses, logs_error: BaseException | None = None):
        self.statuses, self.logs_error, self.stopped = iter(statuses), logs_error, []

    def get_job_status(self, job_id):
        return next(self.statuses)

    def get_job_logs(self, job_id):
        if self.logs_error:
            raise self.logs_error
        return "line\n"

    def stop_job(self, job_id):
        self.stopped.append(job_id)
        return True


def test_follow_job_stops_the_job_past_its_timeout():
    client = FakeClient(["RUNNING"] * 1000)
    with pytest.raises(jobs_api.JobTimedOut) as err:
        jobs_api.follow_job(client, "j", 0.2, lambda text: None, poll_s=0.05)
    assert str(err.value) == "job j still RUNNING after 0 s; it was stopped" and client.stopped == ["j"]
    assert err.value.logs == "line\n"


def test_ctrl_c_stops_the_job_only_when_asked():
    for stop_on_interrupt, stopped in ((True, ["j"]), (False, [])):
        client = FakeClient(["RUNNING"], logs_error=KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            jobs_api.follow_job(client, "j", 60, lambda text: None, stop_on_interrupt=stop_on_interrupt)
        assert client.stopped == stopped


def run_submit(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "jobs.submit", *args], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    return proc, time.monotonic() - started


def error_line(stderr: str) -> str:
    """Our one error line; Ray's own packaging log lines may precede it, a traceback may not."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and stderr.strip().endswith(errors[0]), stderr
    return errors[0]


def test_cli_gives_up_on_a_stalled_dashboard_within_its_timeout():
    with stalled_server() as url:
        proc, elapsed = run_submit("healthcheck", "--address", url, "--timeout", "5")
    assert proc.returncode == 2, proc.stderr
    assert elapsed < 30, elapsed  # 5 s bound (no request waits longer than --timeout) plus start-up
    assert proc.stderr.strip() == f"error: the Ray dashboard at {url} did not answer GET /api/version within 5 s"
    assert "Traceback" not in proc.stderr


def test_cli_stall_while_following_stops_the_job_and_exits_3():
    routes = {
        "GET /api/packages/*": {},
        "POST /api/jobs/": accept_submission,  # the working_dir is "already there"
        "POST /api/jobs/*/stop": STOPPED,
        "GET /api/jobs/*": STALL,
    }
    with fake_dashboard(routes) as dash:
        proc, elapsed = run_submit("healthcheck", "--address", dash.url, "--timeout", "600", "--request-timeout", "1")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert elapsed < 60, elapsed
    (job_id,) = [key.split("/")[3] for key in dash.seen if key.endswith("/stop")]
    assert f"submitted {job_id} to {dash.url}" in proc.stdout
    assert error_line(proc.stderr) == (
        f"error: the Ray dashboard at {dash.url} did not answer GET /api/jobs/{job_id} within 1 s "
        f"while following job {job_id}; it was stopped"
    )
