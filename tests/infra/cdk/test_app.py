"""The cdktf app end to end through the real CLI: a bad config fails before any synth, with the
field's message, no traceback, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.infra.conftest import run_cdktf_synth

pytestmark = pytest.mark.synth


def test_bad_topology_fails_synth_cleanly(tmp_path):
    bad = yaml.safe_load(Path("infra/environments/dev.yaml").read_text())
    bad["slice_groups"][0]["topology"] = "4x5"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    outdir = tmp_path / "out"
    proc = run_cdktf_synth(outdir, {"RAY_TPU_ENVS": str(path)}, timeout_s=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "slice_groups[0].topology: '4x5' is not offered for v6e; valid topologies: 1x1, 2x2, 2x4, 4x4" in output
    assert "Traceback" not in output
    assert not (outdir / "stacks").exists()
