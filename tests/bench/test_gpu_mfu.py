"""bench/gpu_mfu.py's one variant, run here on the CPU with the tiny preset (a GPU runs the sweep):
it loads the model by path, runs the step as the variant says, and prints MFU at MaxText's count
beside the old non-causal one."""

from __future__ import annotations

import json
import subprocess
import sys

from jobs import REPO_ROOT


def test_a_variant_runs_by_path_and_prints_both_counts():
    cmd = [
        sys.executable,
        "bench/gpu_mfu.py",
        "--variant",
        "before",
        "--preset",
        "tiny",
        "--batch",
        "2",
        "--steps",
        "1",
        "--peak-tflops",
        "1",
    ]
    proc = subprocess.run(
        cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("GPU_BENCH ")]
    result = json.loads(line[len("GPU_BENCH ") :])
    assert (result["variant"], result["attention"], result["remat"], result["whole_logits"]) == ("before", "xla", "full", True)
    assert 0 < result["mfu"] < result["mfu_noncausal"] and result["oom"] is False
