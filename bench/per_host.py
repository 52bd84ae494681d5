"""One process per host of a simulated slice, outside Ray: the benchmarks' bare baselines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_per_host(shape, args_for: Callable[[int], list[str]], timeout_s: float) -> list[dict]:
    """Run `python *args_for(i)` for each host i of `shape`, each with the simulation's JAX
    environment (one CPU device per chip); the JSON lines they print, every process's."""
    from jobs.local import cpu_jax_env

    env = {**os.environ, **cpu_jax_env(shape), "PYTHONPATH": str(REPO_ROOT)}
    procs = [
        subprocess.Popen([sys.executable, *args_for(i)], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for i in range(shape.hosts)
    ]
    results: list[dict] = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout_s)
            results += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if len(results) != shape.hosts:
        raise RuntimeError(f"{len(results)} of {shape.hosts} processes reported")
    return results
