"""ray-tpu-gke infrastructure: the TPU catalog, the environment config, the cdktf stacks and the
KubeRay manifests.

Keep this package light to load: the jobs use `infra.catalog` and `infra.config` on the Ray
cluster, where cdktf is not installed. Only `infra.cdk` (the app, the stacks and the constructs)
imports cdktf; `infra.app` is only the entry point `cdktf.json` runs (it calls `infra.cdk.app.main`).
"""

from pathlib import Path

# The repository's root: where `jobs` finds what it uploads and where the simulation keeps its
# state (`jobs.REPO_ROOT` is this one), and what `infra.serving` syncs to the bucket.
REPO_ROOT = Path(__file__).resolve().parent.parent
