"""The environment's bucket mounted in a Ray group's pods with the GCS FUSE CSI driver, at
`infra.serving.BUCKET_MOUNT` (/gcs), for the pods that run vLLM: the RayService's and a batch
RayJob's. vLLM reads a `gs://` model's weights from the mount (`infra.serving.mounted_path`) and
writes its XLA compile cache there, so a restarted engine skips most of the compilation.

- The CSI ephemeral volume and the `gke-gcsfuse/volumes` annotation are what GKE's GCS FUSE
  webhook reads to inject its sidecar; the pod's Workload Identity service account (the
  RayCluster's, from infra.manifests.raycluster) is what reads the bucket.
- `/dev/shm` is a memory emptyDir (vLLM and Ray's object store use shared memory).
"""

from __future__ import annotations

import copy
from typing import Any

from infra.config import Environment
from infra.serving import BUCKET_MOUNT, XLA_CACHE_DIR

BUCKET_VOLUME = "bucket"
FUSE_CACHE_VOLUME = "gke-gcsfuse-cache"  # the name the GCS FUSE sidecar looks for its file cache
SHM_VOLUME = "dshm"
RAY_UID, RAY_GID = 1000, 100  # the rayproject/ray images' `ray` user
# implicit-dirs: directories made by other tools show up; the file cache (unbounded, in the
# sidecar's cache volume) with parallel downloads makes the first read of large weights fast.
MOUNT_OPTIONS = ",".join(
    [
        "implicit-dirs",
        f"uid={RAY_UID}",
        f"gid={RAY_GID}",
        "file-cache:enable-parallel-downloads:true",
        "file-cache:max-size-mb:-1",
    ]
)
# The sidecar gets no CPU/memory/ephemeral-storage limits: model loading is bursty.
FUSE_ANNOTATIONS = {
    "gke-gcsfuse/volumes": "true",
    "gke-gcsfuse/cpu-limit": "0",
    "gke-gcsfuse/memory-limit": "0",
    "gke-gcsfuse/ephemeral-storage-limit": "0",
}
VLLM_CACHE_ENV = {"VLLM_XLA_CACHE_PATH": f"{BUCKET_MOUNT}/{XLA_CACHE_DIR}"}


def volumes(env: Environment) -> list[dict[str, Any]]:
    return [
        {
            "name": BUCKET_VOLUME,
            "csi": {
                "driver": "gcsfuse.csi.storage.gke.io",
                "volumeAttributes": {"bucketName": env.bucket_name, "mountOptions": MOUNT_OPTIONS},
            },
        },
        {"name": FUSE_CACHE_VOLUME, "emptyDir": {}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
    ]


def with_bucket_mount(env: Environment, group_spec: dict[str, Any]) -> dict[str, Any]:
    """A copy of a head or worker group spec (infra.manifests.raycluster) whose pods mount the
    bucket at BUCKET_MOUNT and shared memory at /dev/shm, with vLLM's compile cache in the bucket."""
    spec = copy.deepcopy(group_spec)
    template = spec["template"]
    metadata = template.setdefault("metadata", {})
    metadata["annotations"] = {**metadata.get("annotations", {}), **FUSE_ANNOTATIONS}
    pod = template["spec"]
    pod["volumes"] = [*pod.get("volumes", []), *volumes(env)]
    (container,) = pod["containers"]
    container["env"] = [*container.get("env", []), *({"name": k, "value": v} for k, v in VLLM_CACHE_ENV.items())]
    container["volumeMounts"] = [
        *container.get("volumeMounts", []),
        {"name": BUCKET_VOLUME, "mountPath": BUCKET_MOUNT},
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
    ]
    return spec
