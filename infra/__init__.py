"""ray-tpu-gke infrastructure: the TPU catalog, the environment config, the cdktf stacks and the
KubeRay manifests.

Keep this package's import light: the jobs import `infra.catalog` and `infra.config` on the Ray
cluster, where cdktf is not installed. Only `infra.app`, `infra.stacks` and `infra.components`
import cdktf.
"""
