"""Names shared by the cdktf constructs and the manifests (which must not import cdktf)."""

from __future__ import annotations

from infra.config import Environment

CPU_POOL_NAME = "cpu"
# The node label on every TPU pool naming its slice group; worker pods select it.
SLICE_GROUP_LABEL = "ray-tpu-gke/slice-group"
# Nodes of queued-provisioning pools carry this label (and GKE's taint of the same key); the pods
# meant for them select and tolerate it.
QUEUED_LABEL = "cloud.google.com/gke-queued"
# The pod label naming the Ray cluster (RayCluster or RayService) a pod belongs to; its
# NetworkPolicy selects it. Ours, not KubeRay's `ray.io/cluster`: a RayService's RayCluster gets a
# generated name.
RAY_CLUSTER_LABEL = "ray-tpu-gke/ray-cluster"


def labels(env: Environment) -> dict[str, str]:
    """The labels on everything the manifests print."""
    return {"app.kubernetes.io/part-of": "ray-tpu-gke", "ray-tpu-gke/env": env.name}


def service_account_id(env: Environment, suffix: str) -> str:
    # Service account ids are 6-30 characters.
    return f"{env.cluster_name[: 29 - len(suffix)]}-{suffix}"


def node_service_account_id(env: Environment) -> str:
    return service_account_id(env, "nodes")


def ray_service_account_id(env: Environment) -> str:
    return service_account_id(env, "ray")


def ray_service_account_email(env: Environment) -> str:
    """The Google service account the Ray pods act as, which `RayWorkloadIdentity` creates."""
    return f"{ray_service_account_id(env)}@{env.project}.iam.gserviceaccount.com"


def credentials_command(env: Environment) -> list[str]:
    """`gcloud container clusters get-credentials` for the environment's cluster, through the DNS
    endpoint where the config turns it on (the way in for laptops and Cloud Build's default pool)."""
    cmd = ["gcloud", "container", "clusters", "get-credentials", env.cluster_name, "--location", env.location, "--project", env.project]
    return [*cmd, "--dns-endpoint"] if env.network.dns_endpoint else cmd


AUTH_TOKEN_KEY = "auth_token"  # the key KubeRay's Secret holds the token under (utils/constant.go)


def auth_secret_name(env: Environment) -> str:
    """The Secret holding the RayCluster's token: KubeRay creates it for `authOptions.mode: token`
    under the RayCluster's name (`utils.CheckName`, which keeps a name of <= 50 characters that
    starts with a letter as it is; ours are at most 34)."""
    return env.ray_cluster_name
