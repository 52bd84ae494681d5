"""Submit a workload to a Ray cluster from a laptop or a Cloud Build stage.

  python -m jobs.submit healthcheck --env dev [--address URL] [--timeout S] [--request-timeout S] [-- job args...]

Without an address (`--address` or RAY_ADDRESS) it gets the environment's cluster credentials,
port-forwards the RayCluster head's dashboard port (8265) to 127.0.0.1, submits through the Ray Jobs
API with the repo as working dir and the config's runtime env, follows the logs, and exits with the
job's status (0 succeeded, 1 failed or stopped, 2 could not submit, 3 timed out). The port-forward is
always closed.

Every Jobs API request is bounded (`bounded_client`): a dashboard that accepts the connection and then
goes quiet fails the command with one line naming the request and the address, never a hang. A stall
before the job exists exits 2; once it exists, the job is stopped (bounded too) and the exit is 3.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from infra.config import ConfigError, Environment, environment_names, load_environment
from infra.names import credentials_command
from jobs.cli import JobArgumentParser, positive_seconds

REPO = Path(__file__).resolve().parents[1]
DASHBOARD_PORT = 8265
# Never upload these with the working dir: they are large, local, or secret-adjacent.
EXCLUDES = [".git", ".venv", ".venv-checkov", "node_modules", "cdktf.out", "build", "*.tfstate*", ".terraform"]
TERMINAL = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 1}
WORKLOADS = ("healthcheck", "train")
# Per-request bounds on the Jobs API. They apply to each socket operation, not to the whole request:
# connecting, and handing over each 16 KiB block of a body (CONNECT_S); the answer starting, and each
# read of it (READ_S). A slow but moving working_dir upload or log download is never cut off.
CONNECT_S = 10.0
READ_S = 30.0


class SubmitError(RuntimeError):
    """Could not submit or follow the job; the message says what to do."""


class DashboardStalled(SubmitError):
    """A Jobs API request got no progress within its bound: the dashboard accepted and went quiet."""

    def __init__(self, message: str, method: str, endpoint: str):
        super().__init__(message)
        self.method, self.endpoint = method, endpoint


class JobTimedOut(TimeoutError):
    """Following a job gave up (past its timeout, or the dashboard stalled); the job was stopped if it
    could be. `logs` holds what was read before giving up."""

    def __init__(self, message: str, logs: str = ""):
        super().__init__(message)
        self.logs = logs


def shape_args(env: Environment) -> list[str]:
    """The job's slice comes from the config's first slice group (job args after `--` override)."""
    group = env.slice_groups[0]
    args = ["--generation", group.generation, "--topology", group.topology,
            "--chips-per-host", str(group.shape.chips_per_host), "--slices", str(group.slices)]
    if env.name in environment_names():  # the cluster has the shipped configs in the working dir
        args = ["--env", env.name, *args]
    return args


def runtime_env(env: Environment, extra_env_vars: dict[str, str]) -> dict:
    out: dict = {"working_dir": str(REPO), "excludes": EXCLUDES}
    env_vars = {**env.ray.job_env_vars, **extra_env_vars}
    if env_vars:
        out["env_vars"] = env_vars
    if env.ray.job_pip:
        out["pip"] = list(env.ray.job_pip)
    return out


def _require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise SubmitError(f"{tool} is not on PATH: {hint}")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()
            raise SubmitError(f"kubectl port-forward exited ({proc.returncode}): {err or 'no output'}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise SubmitError(f"the Ray head did not answer on the port-forward within {timeout_s:.0f} s")


@contextlib.contextmanager
def port_forward(
    env: Environment, timeout_s: float = 60, *, service: str | None = None, remote_port: int = DASHBOARD_PORT
) -> Iterator[str]:
    """Credentials + `kubectl port-forward` to a service of the environment's Ray cluster (by
    default the head's dashboard); yields the local URL."""
    _require("gcloud", "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install)")
    kubectl = _require("kubectl", "install it with `gcloud components install kubectl`")
    try:
        creds = subprocess.run(credentials_command(env), capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise SubmitError(f"gcloud get-credentials for {env.cluster_name} took over 120 s") from None
    if creds.returncode:
        reason = " ".join(creds.stderr.split())  # gcloud's advice, on one line
        raise SubmitError(f"cannot get credentials for cluster {env.cluster_name} in {env.location}: {reason}")
    port = _free_port()
    target = f"svc/{service or env.ray_cluster_name + '-head-svc'}"
    proc = subprocess.Popen(
        [kubectl, "port-forward", "-n", env.ray.namespace, target, f"{port}:{remote_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        _wait_for_port(port, proc, timeout_s)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _causes(err: BaseException) -> Iterator[BaseException]:
    """The error, then what it wraps (args, reason, cause, context), outermost first."""
    queue, seen = [err], set()
    while queue:
        e = queue.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        inner = [*getattr(e, "args", ()), getattr(e, "reason", None), e.__cause__, e.__context__]
        queue += [i for i in inner if isinstance(i, BaseException)]


def _stall_phase(err: BaseException) -> str | None:
    """Which socket operation a requests error timed out in ('connect', 'send', 'read'), or None when it
    is no timeout. requests reports some as ConnectionError (a stalled body send, a stalled read of the
    answer's body), so look inside."""
    import requests
    from urllib3.exceptions import ConnectTimeoutError, NewConnectionError, ReadTimeoutError

    kinds = [(requests.ConnectTimeout, "connect"), (ConnectTimeoutError, "connect"),
             (requests.ReadTimeout, "read"), (ReadTimeoutError, "read"), (TimeoutError, "send")]
    for e in _causes(err):
        if isinstance(e, NewConnectionError):
            return None  # refused or unresolvable; urllib3 2 subclasses it from ConnectTimeoutError
        for kind, phase in kinds:
            if isinstance(e, kind):
                return phase
    return None


def _stalled(address: str, method: str, endpoint: str, phase: str, bounds: tuple[float, float]) -> DashboardStalled:
    connect_s, read_s = bounds
    what = {
        "connect": f"did not accept a connection for {method} {endpoint} within {connect_s:g} s",
        "send": f"stopped taking the body of {method} {endpoint} for {connect_s:g} s",
        "read": f"did not answer {method} {endpoint} within {read_s:g} s",
    }[phase]
    return DashboardStalled(f"the Ray dashboard at {address} {what}", method, endpoint)


@functools.cache
def _bounded_client_class() -> type:
    # Built on first use: importing Ray costs seconds that `--print-credentials-command` should not pay.
    import requests
    from ray.job_submission import JobSubmissionClient

    class BoundedJobSubmissionClient(JobSubmissionClient):
        def __init__(self, address: str, *, connect_s: float, read_s: float, **kwargs):
            self.bounds = (connect_s, read_s)  # set first: the base constructor already sends requests
            super().__init__(address, **kwargs)

        def _do_request(self, method: str, endpoint: str, *, data=None, json_data=None, **kwargs):
            kwargs.setdefault("timeout", self.bounds)
            if isinstance(data, bytes):
                # urllib3 sends a bytes body with one sendall(), whose timeout bounds the whole upload;
                # a file object goes in 16 KiB blocks, each bounded: a big working_dir still gets through.
                data = io.BytesIO(data)
            try:
                return super()._do_request(method, endpoint, data=data, json_data=json_data, **kwargs)
            except requests.RequestException as err:
                phase = _stall_phase(err)
                if phase is None:
                    raise
                raise _stalled(self._address, method, endpoint, phase, self.bounds) from None

    return BoundedJobSubmissionClient


def bounded_client(address: str, connect_s: float = CONNECT_S, read_s: float = READ_S):
    """A Ray `JobSubmissionClient` whose every request, the constructor's version checks included, raises
    DashboardStalled after `connect_s` without connecting or sending, or `read_s` without an answer."""
    return _bounded_client_class()(address, connect_s=connect_s, read_s=read_s)


def _reachable(address: str, bounds: tuple[float, float]) -> None:
    import requests

    try:
        requests.get(f"{address.rstrip('/')}/api/version", timeout=bounds).raise_for_status()
    except requests.RequestException as err:
        phase = _stall_phase(err)
        if phase is not None:
            raise _stalled(address, "GET", "/api/version", phase, bounds) from None
        raise SubmitError(f"no Ray dashboard answers at {address}: {err.__class__.__name__}; is the cluster up?") from None


def new_submission_id() -> str:
    """Ray's own form (`raysubmit_...`), chosen here so a job whose POST got no answer can still be stopped."""
    return f"raysubmit_{secrets.token_hex(8)}"


def _stop(client, job_id: str) -> str:
    """Stop the job (each request bounded by the client); say how it went, for the error line."""
    try:
        client.stop_job(job_id)
    except Exception as err:  # noqa: BLE001 - reported, not raised: the reason we stopped matters more
        return f"stopping it failed too ({' '.join(str(err).split()) or err.__class__.__name__}); it may still be running"
    return "it was stopped"


def submit_job(client, entrypoint: str, runtime_env: dict, submission_id: str | None = None) -> str:
    """Submit through the Jobs API; returns the job id. A POST that stalls may still have started the
    job, so it is stopped before SubmitError is raised."""
    submission_id = submission_id or new_submission_id()
    try:
        return client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env, submission_id=submission_id)
    except DashboardStalled as err:
        if (err.method, err.endpoint) != ("POST", "/api/jobs/"):
            raise  # stalled before the job could exist (version check, upload)
        raise SubmitError(f"{err}; job {submission_id} may have started anyway: {_stop(client, submission_id)}") from None


def _status_name(status) -> str:
    return str(getattr(status, "value", status))  # a JobStatus enum from Ray; a plain string from fakes


def follow_job(
    client, job_id: str, timeout_s: float, on_logs: Callable[[str], None], *, poll_s: float = 1.0, stop_on_interrupt: bool = False
) -> tuple[str, str]:
    """The one follow loop (jobs.submit and jobs.demo): poll the job's status and logs until it ends,
    handing each new piece of logs to `on_logs`; returns (status, logs). Past `timeout_s`, or when the
    dashboard stalls, the job is stopped and JobTimedOut raised. With `stop_on_interrupt`, Ctrl-C (or
    any other error) stops the job too before propagating."""
    deadline, logs = time.monotonic() + timeout_s, ""
    try:
        while True:
            status = _status_name(client.get_job_status(job_id))
            latest = client.get_job_logs(job_id)
            if len(latest) > len(logs):
                on_logs(latest[len(logs):])
            logs = latest
            if status in TERMINAL:
                return status, logs
            if time.monotonic() > deadline:
                reason = f"job {job_id} still {status} after {timeout_s:.0f} s"
                break
            time.sleep(poll_s)
    except DashboardStalled as err:
        reason = f"{err} while following job {job_id}"
    except BaseException:
        if stop_on_interrupt:
            _stop(client, job_id)
        raise
    raise JobTimedOut(f"{reason}; {_stop(client, job_id)}", logs)


def follow(client, job_id: str, timeout_s: float, poll_s: float = 1.0, out=sys.stdout) -> str:
    """Print the job's logs as they grow until it ends; stop it and raise JobTimedOut (a TimeoutError)
    on timeout or when the dashboard stalls."""

    def write(text: str) -> None:
        out.write(text)
        out.flush()

    status, _ = follow_job(client, job_id, timeout_s, write, poll_s=poll_s)
    return status


def submit(
    address: str, entrypoint: str, env: Environment, env_vars: dict[str, str], timeout_s: float,
    *, connect_s: float = CONNECT_S, read_s: float = READ_S,
) -> str:
    _reachable(address, (connect_s, read_s))
    client = bounded_client(address, connect_s, read_s)
    job_id = submit_job(client, entrypoint, runtime_env(env, env_vars))
    print(f"submitted {job_id} to {address}: {entrypoint}", flush=True)
    return follow(client, job_id, timeout_s)


def check_job_args(job: str, argv: list[str]) -> None:
    """Parse the job's arguments here, as the job will on the cluster, so a bad flag fails now (exit 2,
    one paragraph naming it) rather than minutes later on the cluster."""
    import importlib

    importlib.import_module(f"jobs.{job}").parse_args(argv)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = JobArgumentParser(prog="python -m jobs.submit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", nargs="?", help="a workload module of jobs/, e.g. healthcheck or train")
    parser.add_argument("--env", default="dev", help="environment config (infra/environments/<env>.yaml)")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"), help="Ray dashboard URL (default: RAY_ADDRESS, else port-forward)")
    parser.add_argument("--timeout", type=positive_seconds, default=3600, help="seconds to wait for the job to finish")
    parser.add_argument("--request-timeout", type=positive_seconds, default=READ_S, metavar="SECONDS",
                        help=f"seconds any one Jobs API request may wait for the dashboard (default {READ_S:g}; at most --timeout)")
    parser.add_argument("--env-var", action="append", default=[], metavar="KEY=VALUE", help="extra runtime env variable")
    parser.add_argument("--print-credentials-command", action="store_true", help="print the gcloud get-credentials command and exit")
    ours, job_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(ours)
    args.job_args = job_args
    bad = [kv for kv in args.env_var if "=" not in kv]
    if bad:
        parser.error(f"--env-var takes KEY=VALUE, got {bad[0]!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        env = load_environment(args.env)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.print_credentials_command:
        print(shlex.join(credentials_command(env)))
        return 0
    if args.job not in WORKLOADS:
        which = f"job {args.job!r} is not a workload" if args.job else "no job given"
        print(f"error: {which}; valid: {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    job_argv = [*shape_args(env), *args.job_args]
    check_job_args(args.job, job_argv)  # exits 2 on a bad flag, before any upload
    entrypoint = shlex.join(["python", "-m", f"jobs.{args.job}", *job_argv])
    env_vars = dict(kv.split("=", 1) for kv in args.env_var)
    try:
        with (contextlib.nullcontext(args.address) if args.address else port_forward(env)) as address:
            # No single request may wait longer than the whole job may take.
            read_s = min(args.request_timeout, args.timeout)
            status = submit(address, entrypoint, env, env_vars, args.timeout, connect_s=min(CONNECT_S, read_s), read_s=read_s)
    except SubmitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except TimeoutError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    except (OSError, RuntimeError) as err:  # the dashboard went away, or answered an error, mid-way
        where = args.address or "the port-forwarded Ray head"
        print(f"error: the Ray Jobs API at {where} failed: {' '.join(str(err).split()) or type(err).__name__}", file=sys.stderr)
        return 2
    print(f"job {status.lower()}", flush=True)
    return TERMINAL[status]


if __name__ == "__main__":
    sys.exit(main())
