"""Names shared by the cdktf constructs and the manifests (which must not import cdktf)."""

from __future__ import annotations

from infra.config import Environment

CPU_POOL_NAME = "cpu"


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
