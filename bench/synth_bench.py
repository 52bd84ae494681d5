"""Synth cost of the default environment against the bare import of the provider module it
cannot avoid, measured in the same run, each in a fresh process.

  baseline: python -c "import cdktf_cdktf_provider_google.container_cluster"
  ours:     build and synth the dev stack (infra.cdk.app) into a temp dir

Peak memory is the largest sum of RSS over the process and its children (jsii runs a node
process beside Python), sampled every 20 ms with psutil. Target: <= 1.15x for both.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
TARGET = 1.15

BASELINE = "import cdktf_cdktf_provider_google.container_cluster"
OURS = (
    "import sys\n"
    "from infra.cdk.app import build_app\n"
    "from infra.config import load_environment\n"
    "build_app([load_environment('dev')], sys.argv[1]).synth()\n"
)


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run(code: str, timeout_s: float = 600) -> tuple[float, float]:
    """(seconds, peak MiB of the process tree) of one fresh interpreter running `code`."""
    env = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", code, out], env=env)
        watched, peak = psutil.Process(child.pid), 0
        while child.poll() is None:
            if time.perf_counter() - start > timeout_s:
                child.kill()
                raise TimeoutError(f"benchmark step ran past {timeout_s} s")
            peak = max(peak, tree_rss(watched))
            time.sleep(0.02)
        seconds = time.perf_counter() - start
        if child.returncode:
            raise RuntimeError(f"benchmark step failed with exit {child.returncode}")
    return seconds, peak / 2**20


def main() -> None:
    ours, base = [], []
    for _ in range(REPEATS):  # interleaved, so machine noise hits both sides alike
        base.append(run(BASELINE))
        ours.append(run(OURS))
    o_s, b_s = (statistics.median(x[0] for x in r) for r in (ours, base))
    o_m, b_m = (statistics.median(x[1] for x in r) for r in (ours, base))
    print(f"synth of the dev stack vs bare `{BASELINE}` (median of {REPEATS}):")
    for what, ratio, line in (
        ("time", o_s / b_s, f"ours {o_s:6.1f} s    baseline {b_s:6.1f} s  "),
        ("memory", o_m / b_m, f"ours {o_m:6.0f} MiB  baseline {b_m:6.0f} MiB"),
    ):  # each target's line ends in `met` or `NOT met`
        print(f"  {what:7} {line}  ratio {ratio:.2f}x  (target <= {TARGET}x: {'met' if ratio <= TARGET else 'NOT met'})")


if __name__ == "__main__":
    main()
