"""What a job submitted from this repo uploads and runs with (its Ray runtime env)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra.config import Environment
from jobs import REPO_ROOT

# Never upload these with the working dir: they are large, local, caches, or secret-adjacent (Ray
# also honours .gitignore).
EXCLUDES = [
    ".git",
    ".venv",
    ".venv-*",
    "node_modules",
    "build",
    "cdktf.out",
    ".terraform",
    "*.tfstate*",
    "**/__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".gen",
]


def working_dir_runtime_env(env_vars: dict[str, str] | None = None, pip: list[str] | None = None) -> dict[str, Any]:
    """The repo as the job's working dir (without EXCLUDES), with these variables and pip installs."""
    out: dict[str, Any] = {"working_dir": str(REPO_ROOT), "excludes": list(EXCLUDES)}
    if env_vars:
        out["env_vars"] = dict(env_vars)
    if pip:
        out["pip"] = list(pip)
    return out


def runtime_env(env: Environment, extra_env_vars: dict[str, str], job_pip: Sequence[str] = ()) -> dict[str, Any]:
    """What `jobs.submit` submits with: the environment's job variables and pip installs, and the
    job's own requirements (a workload's REQUIREMENTS)."""
    pip = list(dict.fromkeys([*env.ray.job_pip, *job_pip]))
    return working_dir_runtime_env({**env.ray.job_env_vars, **extra_env_vars}, pip)
