"""Submit a workload to a Ray cluster from a laptop or a Cloud Build stage.

  python -m jobs.submit healthcheck --env dev [--address URL] [--timeout S] [-- job args...]

Without an address (`--address` or RAY_ADDRESS) it gets the environment's cluster credentials,
port-forwards the RayCluster head's dashboard port (8265) to 127.0.0.1, submits through the Ray Jobs
API with the repo as working dir and the config's runtime env, follows the logs, and exits with the
job's status (0 succeeded, 1 failed or stopped, 2 could not submit, 3 timed out). The port-forward is
always closed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from infra.config import ConfigError, Environment, environment_names, load_environment

REPO = Path(__file__).resolve().parents[1]
DASHBOARD_PORT = 8265
# Never upload these with the working dir: they are large, local, or secret-adjacent.
EXCLUDES = [".git", ".venv", ".venv-checkov", "node_modules", "cdktf.out", "build", "*.tfstate*", ".terraform"]
TERMINAL = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 1}
WORKLOADS = ("healthcheck", "train")


class SubmitError(RuntimeError):
    """Could not submit or follow the job; the message says what to do."""


def credentials_command(env: Environment) -> list[str]:
    return ["gcloud", "container", "clusters", "get-credentials", env.cluster_name,
            "--location", env.location, "--project", env.project]


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


def _reachable(address: str, timeout_s: float) -> None:
    import requests

    try:
        requests.get(f"{address.rstrip('/')}/api/version", timeout=timeout_s).raise_for_status()
    except requests.RequestException as err:
        raise SubmitError(f"no Ray dashboard answers at {address}: {err.__class__.__name__}; is the cluster up?") from None


def follow(client, job_id: str, timeout_s: float, poll_s: float = 1.0, out=sys.stdout) -> str:
    """Print the job's logs as they grow until it ends; stop it and raise on timeout."""
    deadline, printed = time.monotonic() + timeout_s, 0
    while True:
        status = str(client.get_job_status(job_id)).split(".")[-1]
        logs = client.get_job_logs(job_id)
        out.write(logs[printed:])
        out.flush()
        printed = len(logs)
        if status in TERMINAL:
            return status
        if time.monotonic() > deadline:
            client.stop_job(job_id)
            raise TimeoutError(f"job {job_id} still {status} after {timeout_s:.0f} s; it was stopped")
        time.sleep(poll_s)


def submit(address: str, entrypoint: str, env: Environment, env_vars: dict[str, str], timeout_s: float) -> str:
    from ray.job_submission import JobSubmissionClient

    _reachable(address, 15)
    client = JobSubmissionClient(address)
    job_id = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env(env, env_vars))
    print(f"submitted {job_id} to {address}: {entrypoint}", flush=True)
    return follow(client, job_id, timeout_s)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m jobs.submit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", nargs="?", help="a workload module of jobs/, e.g. healthcheck or train")
    parser.add_argument("--env", default="dev", help="environment config (infra/environments/<env>.yaml)")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"), help="Ray dashboard URL (default: RAY_ADDRESS, else port-forward)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for the job to finish")
    parser.add_argument("--env-var", action="append", default=[], metavar="KEY=VALUE", help="extra runtime env variable")
    parser.add_argument("--print-credentials-command", action="store_true", help="print the gcloud get-credentials command and exit")
    ours, job_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(ours)
    args.job_args = job_args
    if args.timeout <= 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
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
        print(f"error: job {args.job!r} is not a workload; valid: {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    entrypoint = shlex.join(["python", "-m", f"jobs.{args.job}", *shape_args(env), *args.job_args])
    env_vars = dict(kv.split("=", 1) for kv in args.env_var)
    try:
        with (contextlib.nullcontext(args.address) if args.address else port_forward(env)) as address:
            status = submit(address, entrypoint, env, env_vars, args.timeout)
    except SubmitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except TimeoutError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    print(f"job {status.lower()}", flush=True)
    return TERMINAL[status]


if __name__ == "__main__":
    sys.exit(main())
