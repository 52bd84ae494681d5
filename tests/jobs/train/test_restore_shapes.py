"""A rerun restores into abstract shapes: `ShardedState(initialize=False)` builds no parameters at
all (before, every host made the whole model in numpy first: ~32 GB of float32 for `8b`), and the
shards it hands Orbax to restore into are per chip exactly what the 8b shape test computes
(tests/jobs/train/test_model_pure.py: per_chip_bytes). On 16 CPU devices in one process, the v6e
4x4's chips."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from infra import catalog
from jobs import REPO_ROOT
from jobs.train.model import PRESETS, param_count
from tests.jobs.train.test_model_pure import per_chip_bytes

CODE = """
import json, resource, sys
import jax, numpy as np
from jobs.train import parse_config
from jobs.train.state import ShardedState

_, config, *_ = parse_config(sys.argv[1:])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
state = ShardedState(config, initialize=False)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
params, opt = state.abstract()
per_device = {}
for leaf in jax.tree.leaves(params) + jax.tree.leaves(opt):
    block = np.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
    for device in leaf.sharding.addressable_devices:
        per_device[device.id] = per_device.get(device.id, 0) + int(block)
print(json.dumps({"built": state.params is not None, "grown": grown, "per_device": sorted(per_device.values()),
                  "params_per_device": int(sum(np.prod(l.sharding.shard_shape(l.shape)) * 4 for l in jax.tree.leaves(params)))}))
"""


# A 16-device JAX process: half a minute on 2 busy cores, so `make test-slow` (keeps make test under 12 minutes).
@pytest.mark.slow
def test_8b_restores_into_abstract_shards_of_the_per_chip_size_and_builds_nothing(tmp_path):
    shape = catalog.shape("v6e", "4x4")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={shape.chips}"}
    argv = ["--generation", "v6e", "--topology", "4x4", "--preset", "8b", "--storage", str(tmp_path), "--batch-size", "16"]
    out = subprocess.run([sys.executable, "-c", CODE, *argv], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert not got["built"]
    full = param_count(PRESETS["8b"]) * 4
    assert got["grown"] < full / 32  # no whole model on the host: under 1 GiB against 30 GiB
    need = per_chip_bytes(PRESETS["8b"], shape.chips)
    assert len(got["per_device"]) == shape.chips
    assert got["params_per_device"] == pytest.approx(need["params"], rel=0.01)
    assert max(got["per_device"]) == pytest.approx(need["params"] + need["optimizer"], rel=0.01)
    assert max(got["per_device"]) < shape.hbm_bytes / shape.chips  # what a restore puts on a chip fits
