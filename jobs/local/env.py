"""The environment of the simulation's processes (pure): what GKE's TPU webhook would inject into a
TPU host, JAX on CPU with one device per chip, Ray's files kept under the state dir, and the rule
that keeps Ray's unix socket paths short enough."""

from __future__ import annotations

import os
import secrets
import shlex
import sys
from pathlib import Path

from infra import catalog
from jobs import REPO_ROOT

# A unix socket path may not exceed 107 bytes; Ray appends "/session_<date>_<pid>/sockets/plasma_store"
# to its temp dir. (Why the tests and the simulation keep Ray's files in short directories.)
RAY_SOCKET_SUFFIX = len("/session_2026-01-01_00-00-00_000000_1234567/sockets/plasma_store")
MAX_SOCKET_PATH = 107


def socket_path_problem(temp_dir: str | Path) -> str | None:
    """Why Ray's unix sockets under `temp_dir` would be too long, or None (pure)."""
    if len(str(temp_dir)) + RAY_SOCKET_SUFFIX > MAX_SOCKET_PATH:
        return f"{temp_dir} is too long for Ray's unix sockets (at most {MAX_SOCKET_PATH - RAY_SOCKET_SUFFIX} characters)"
    return None


def slice_name(shape: catalog.SliceShape, index: int) -> str:
    return f"sim-{shape.pod_type}-{index}"


def host_env(shape: catalog.SliceShape, name: str, worker_id: int) -> dict[str, str]:
    """The environment of one simulated host: what GKE's TPU webhook would inject, plus JAX on CPU
    with one device per chip (pure)."""
    return {
        "TPU_NAME": name,
        "TPU_WORKER_ID": str(worker_id),
        "TPU_ACCELERATOR_TYPE": shape.pod_type,
        "TPU_TOPOLOGY": shape.topology,
        **cpu_jax_env(shape),
    }


def cpu_jax_env(shape: catalog.SliceShape) -> dict[str, str]:
    """JAX on CPU, one device per chip: what a job's runtime env needs on the simulation."""
    return {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={shape.jax_devices_per_host}",
    }


TOKEN_FILE = "auth_token"


def ray_env(state_dir: str | Path) -> dict[str, str]:
    """The Ray settings of the simulation's nodes and of every client of it: Ray's files under
    `state_dir`/ray, token authentication on as on GKE, with the cluster's token read from
    `state_dir`/auth_token (never ~/.ray), and no usage stats (pure)."""
    state_dir = Path(state_dir)
    return {
        "RAY_TMPDIR": str(state_dir / "ray"),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(state_dir / TOKEN_FILE),
        "RAY_USAGE_STATS_ENABLED": "0",
    }


def write_token(state_dir: str | Path) -> Path:
    """A new random token for the cluster in `state_dir`, readable by its owner only (0600)."""
    path = Path(state_dir) / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a file left by an earlier cluster keeps its mode otherwise
        os.write(fd, secrets.token_urlsafe(32).encode())
    finally:
        os.close(fd)
    return path


def client_exports(state_dir: str | Path, dashboard_url: str) -> str:
    """Shell lines that point `ray job submit` (and any Ray client) at the simulated cluster: the
    token's path, never the token."""
    env = {"RAY_ADDRESS": dashboard_url, **{k: v for k, v in ray_env(state_dir).items() if k.startswith("RAY_AUTH")}}
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


def clean_base_env() -> dict[str, str]:
    # A developer's shell may carry TPU or Ray variables from elsewhere; the nodes must not inherit them.
    drop = ("TPU_", "MEGASCALE_", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_", "JAX_", "XLA_FLAGS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    # `python` in a job's entrypoint must be this interpreter (the one with Ray and JAX), as it is
    # the image's on GKE; and the repo must be importable by workers started outside a job.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def state_dir_problem(state_dir: str | Path) -> str | None:
    """Why `state_dir` cannot hold a local cluster (its state, logs and Ray's sockets), or None."""
    state_dir = Path(state_dir).resolve()
    existing = next(p for p in (state_dir, *state_dir.parents) if p.exists())  # the root always exists
    if not existing.is_dir():
        return f"{existing} is not a directory; pass another --state-dir"
    problem = socket_path_problem(state_dir / "ray")
    return f"{problem}; pass a shorter --state-dir" if problem else None
