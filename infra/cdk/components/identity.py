"""Service accounts: a least-privilege one for the nodes (never the default compute account) and
one for the Ray pods, bound to their Kubernetes service account through Workload Identity."""

from __future__ import annotations

from cdktf import ITerraformDependable
from cdktf_cdktf_provider_google.project_iam_member import ProjectIamMember
from cdktf_cdktf_provider_google.service_account import ServiceAccount
from cdktf_cdktf_provider_google.service_account_iam_member import ServiceAccountIamMember
from constructs import Construct

from infra.config import Environment
from infra.names import node_service_account_id, ray_service_account_id

# What GKE nodes need to run: write logs and metrics, pull images. Nothing else.
NODE_ROLES = (
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/monitoring.viewer",
    "roles/stackdriver.resourceMetadata.writer",
    "roles/autoscaling.metricsWriter",
    "roles/artifactregistry.reader",
)


class NodeServiceAccount(Construct):
    def __init__(self, scope: Construct, id_: str, *, env: Environment) -> None:
        super().__init__(scope, id_)
        self.account = ServiceAccount(self, "sa", account_id=node_service_account_id(env), display_name=f"GKE nodes of {env.cluster_name}")
        for role in NODE_ROLES:
            ProjectIamMember(
                self,
                role.split("/")[-1],
                project=env.project,
                role=role,
                member=f"serviceAccount:{self.account.email}",
            )

    @property
    def email(self) -> str:
        return self.account.email


class RayWorkloadIdentity(Construct):
    """The Google service account the Ray pods act as (bucket access), bound to the Kubernetes
    service account `ray.namespace/ray.kubernetes_service_account` that the RayCluster uses."""

    def __init__(self, scope: Construct, id_: str, *, env: Environment, cluster: ITerraformDependable) -> None:
        super().__init__(scope, id_)
        self.account = ServiceAccount(
            self, "sa", account_id=ray_service_account_id(env), display_name=f"Ray workloads on {env.cluster_name}"
        )
        ksa = f"{env.ray.namespace}/{env.ray.kubernetes_service_account}"
        # The workload pool exists only once the first Workload Identity cluster does.
        ServiceAccountIamMember(
            self,
            "workload-identity",
            service_account_id=self.account.name,
            role="roles/iam.workloadIdentityUser",
            member=f"serviceAccount:{env.project}.svc.id.goog[{ksa}]",
            depends_on=[cluster],
        )

    @property
    def email(self) -> str:
        return self.account.email
