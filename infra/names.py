"""Names shared by the cdktf constructs and the manifests (which must not import cdktf)."""

from __future__ import annotations

from infra.config import Environment

CPU_POOL_NAME = "cpu"
# The node label on every TPU pool naming its slice group; worker pods select it.
SLICE_GROUP_LABEL = "ray-tpu-gke/slice-group"


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
