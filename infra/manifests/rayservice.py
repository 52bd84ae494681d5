"""The KubeRay `ray.io/v1` RayService that serves the environment's LLM (`serving` in its config).

- `serveConfigV2`: one application, `jobs.serve:build_app` with `args: {env: NAME}`: Ray Serve LLM's
  OpenAI app, the LLMConfig derived from the config (infra.serving.llm_config_kwargs).
- `rayClusterConfig`: the RayCluster's head group and the TPU worker group of `serving.slice_group`
  (infra.manifests.raycluster), with `serving.replicas` slices: one replica per whole slice. Those
  slices are the RayService's alone (the RayCluster gets the group's other slices), and its worker
  group is named `<group>-serve`: older Ray TPU webhooks pair a multi-host replica's pods by
  `<groupName>-<replica>` across every RayCluster in the namespace.
- Every pod mounts the environment's bucket with the GCS FUSE CSI driver at /gcs, and shared
  memory at /dev/shm (infra.manifests.bucket_mount): the weights of a `gs://` model are read from
  there, the XLA compile cache is written there (so a restarted replica skips most of the
  compilation), and the repo's `infra/` and `jobs/` are loaded from there (`CODE_DIR`, uploaded by
  `python -m jobs.serve --print-code-sync`). Its Workload Identity service account is the
  RayCluster's.
- Every pod runs Ray Serve's high-throughput path (`infra.serving.SERVE_FAST_PATH_ENV`): HAProxy on
  port 8000 in place of the Python proxy, and the vLLM server replica as its own ingress (direct
  streaming), as `bench/serve_bench.py` measures it against `vllm serve`.
- A Hugging Face token only ever comes from a Secret (`serving.hf_token_secret`, key HF_TOKEN).

The image is `serving.image` (the project's serving image, with vLLM: Cloud Build's manifests stage
passes the one it built). Without one the RayService is refused, except where the config sets
`serving.pip_install_vllm` (dev): Ray's Python 3.12 image, with vllm-tpu installed by the
application's runtime env at every replica start (infra.serving.serve_image / serve_pip).
"""

from __future__ import annotations

from typing import Any

import yaml

from infra.config import ConfigError, Environment
from infra.manifests.bucket_mount import with_bucket_mount
from infra.manifests.raycluster import RayClusterPods, auth_options, head_group, labels, tpu_worker_group
from infra.serving import (
    APP_NAME,
    BUCKET_MOUNT,
    CODE_PREFIX,
    ENV_VAR,
    SERVE_APP,
    SERVE_FAST_PATH_ENV,
    SERVE_MULTI_NODE_ENV,
    SERVE_PORT,
    ServeConfigError,
    llm_config_kwargs,
    serve_image,
    serve_pip,
)

CODE_DIR = f"{BUCKET_MOUNT}/{CODE_PREFIX}"  # gs://BUCKET/code/ray-tpu-gke/{infra,jobs}
HF_TOKEN_KEY = "HF_TOKEN"


def serve_group_name(group: str) -> str:
    return f"{group}-serve"


def ray_service_name(env: Environment) -> str:
    return f"{env.cluster_name}-serve"


def serve_service_name(env: Environment) -> str:
    """The Service KubeRay creates for the Serve proxies (port 8000)."""
    return f"{ray_service_name(env)}-serve-svc"


def serve_config(env: Environment) -> dict[str, Any]:
    """serveConfigV2, as a mapping (the manifest holds it as a YAML string)."""
    runtime_env: dict[str, Any] = {"env_vars": {ENV_VAR: env.name}}
    pip = serve_pip(env)
    if pip:
        runtime_env["pip"] = pip
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": SERVE_PORT},
        "applications": [
            {
                "name": APP_NAME,
                "route_prefix": "/",
                "import_path": SERVE_APP,
                "args": {"env": env.name},
                "runtime_env": runtime_env,
            }
        ],
    }


def _pod_env(env: Environment) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "PYTHONPATH", "value": CODE_DIR},
        {"name": ENV_VAR, "value": env.name},
        # Ray Serve's high-throughput path (HAProxy, direct streaming): read by the Serve
        # controller and proxies at start, so it goes on every pod (infra.serving, with sources).
        *({"name": k, "value": v} for k, v in {**SERVE_FAST_PATH_ENV, **SERVE_MULTI_NODE_ENV}.items()),
    ]
    if env.serving and env.serving.hf_token_secret:
        out.append({"name": HF_TOKEN_KEY, "valueFrom": {"secretKeyRef": {"name": env.serving.hf_token_secret, "key": HF_TOKEN_KEY}}})
    return out


def _with_serving(env: Environment, group_spec: dict[str, Any], image: str) -> dict[str, Any]:
    """A head or worker group spec from raycluster.py, plus what serving needs: the bucket mount
    (infra.manifests.bucket_mount), the serving image, the code from the bucket."""
    spec = with_bucket_mount(env, group_spec)
    (container,) = spec["template"]["spec"]["containers"]
    container["image"] = image
    container["env"] = [*container.get("env", []), *_pod_env(env)]
    return spec


def ray_service(env: Environment) -> dict[str, Any]:
    """The RayService for `env.serving`; a ConfigError if the config cannot be served."""
    if env.serving is None:
        raise ConfigError(f"environment {env.name!r}", ["serving: no serving section, so no RayService"])
    try:
        llm_config_kwargs(env)  # every check the deployment will make, before anything is printed
        image = serve_image(env)  # the serving image, or dev's explicit pip install of vLLM
    except ServeConfigError as err:
        raise ConfigError(f"environment {env.name!r}", [f"serving: {err}"]) from None
    group = env.slice_group(env.serving.slice_group)
    replicas = env.serving.replicas
    # KubeRay names this RayService's RayCluster (and so its token's Secret) itself: the operator
    # injects the token into every Ray container, and sends it to the dashboard it deploys through.
    cluster = RayClusterPods(ray_service_name(env), token_secret=None)
    worker = _with_serving(env, tpu_worker_group(env, group, cluster, slices=replicas, name=serve_group_name(group.name)), image)
    worker["minReplicas"] = replicas
    spec: dict[str, Any] = {
        "serveConfigV2": yaml.safe_dump(serve_config(env), sort_keys=False),
        "rayClusterConfig": {
            "rayVersion": env.ray.version,
            "authOptions": auth_options(env),
            "headGroupSpec": _with_serving(env, head_group(env, cluster), image),
            "workerGroupSpecs": [worker],
        },
        # KubeRay's default upgrade (NewCluster) brings up a second cluster next to the serving one
        # when rayClusterConfig changes: with no spare slices (the RayCluster holds the group's
        # others) it would wait for TPUs forever. serveConfigV2 changes still apply in place;
        # cluster changes need a delete and re-apply.
        "upgradeStrategy": {"type": "None"},
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {
            "name": ray_service_name(env),
            "namespace": env.ray.namespace,
            "labels": {**labels(env), "ray-tpu-gke/serving": "true"},
        },
        "spec": spec,
    }
