"""One stack per environment (`ray-tpu-dev`, ...), composed of one construct per concern."""

from __future__ import annotations

from cdktf import GcsBackend, LocalBackend, TerraformOutput, TerraformStack
from cdktf_cdktf_provider_google.provider import GoogleProvider
from constructs import Construct

from infra.cdk.components.cluster import GkeCluster
from infra.cdk.components.cpu_node_pool import CpuNodePool
from infra.cdk.components.identity import NodeServiceAccount, RayWorkloadIdentity
from infra.cdk.components.network import Network
from infra.cdk.components.storage import CheckpointBucket
from infra.cdk.components.tpu_node_pools import TpuSlicePools
from infra.config import Environment
from infra.names import credentials_command


def local_state_path(env: Environment) -> str:
    # Terraform runs in cdktf.out/stacks/<stack>/: keep state at the repo root, by a relative path
    # (cdktf's default is absolute, which breaks on any other checkout).
    return f"../../../terraform.{env.stack_name}.tfstate"


class RayTpuStack(TerraformStack):
    def __init__(self, scope: Construct, env: Environment) -> None:
        super().__init__(scope, env.stack_name)
        self.env = env
        if env.state_bucket:
            GcsBackend(self, bucket=env.state_bucket, prefix=f"ray-tpu-gke/{env.stack_name}")
        else:
            LocalBackend(self, path=local_state_path(env))
        GoogleProvider(self, "google", project=env.project, region=env.region, zone=env.zone)

        self.network = Network(self, "network", env=env)
        self.nodes_sa = NodeServiceAccount(self, "node-identity", env=env)
        self.cluster = GkeCluster(self, "gke", env=env, network=self.network, node_service_account=self.nodes_sa.email)
        if env.mode == "standard":
            CpuNodePool(self, "cpu-pool", env=env, cluster_id=self.cluster.id, service_account=self.nodes_sa.email)
            self.tpu_pools = TpuSlicePools(self, "tpu-pools", env=env, cluster_id=self.cluster.id, service_account=self.nodes_sa.email)
        self.ray_identity = RayWorkloadIdentity(self, "ray-identity", env=env, cluster=self.cluster.cluster)
        self.bucket = CheckpointBucket(self, "storage", env=env, writer_email=self.ray_identity.email)

        TerraformOutput(self, "cluster_name", value=self.cluster.name)
        TerraformOutput(self, "cluster_location", value=env.location)
        TerraformOutput(
            self,
            "get_credentials",
            value=" ".join(credentials_command(env)),
        )
        TerraformOutput(self, "bucket", value=self.bucket.url)
        TerraformOutput(self, "ray_service_account", value=self.ray_identity.email)
        TerraformOutput(
            self,
            "apply_ray_cluster",
            value=f"python -m infra manifests --env {env.name} | kubectl apply -f -",
        )
