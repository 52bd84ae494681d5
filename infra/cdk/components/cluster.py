"""The GKE cluster: private nodes, Workload Identity, shielded nodes, a release channel, managed
Prometheus, and the Ray Operator add-on (KubeRay plus the Ray TPU webhook that gives every TPU host
its `ray.io/tpu-slice-name` and worker id) with Ray cluster logging and monitoring.

Standard mode drops the default node pool (the CPU and TPU pools are declared separately).
Autopilot mode has no node pools at all: GKE provisions TPU slices from the pods' nodeSelectors.
"""

from __future__ import annotations

from cdktf_cdktf_provider_google.container_cluster import (
    ContainerCluster,
    ContainerClusterAddonsConfig,
    ContainerClusterAddonsConfigGcsFuseCsiDriverConfig,
    ContainerClusterAddonsConfigRayOperatorConfig,
    ContainerClusterAddonsConfigRayOperatorConfigRayClusterLoggingConfig,
    ContainerClusterAddonsConfigRayOperatorConfigRayClusterMonitoringConfig,
    ContainerClusterBinaryAuthorization,
    ContainerClusterClusterAutoscaling,
    ContainerClusterClusterAutoscalingAutoProvisioningDefaults,
    ContainerClusterControlPlaneEndpointsConfig,
    ContainerClusterControlPlaneEndpointsConfigDnsEndpointConfig,
    ContainerClusterIpAllocationPolicy,
    ContainerClusterLoggingConfig,
    ContainerClusterMasterAuth,
    ContainerClusterMasterAuthClientCertificateConfig,
    ContainerClusterMasterAuthorizedNetworksConfig,
    ContainerClusterMasterAuthorizedNetworksConfigCidrBlocks,
    ContainerClusterMonitoringConfig,
    ContainerClusterMonitoringConfigManagedPrometheus,
    ContainerClusterNodeConfig,
    ContainerClusterNodeConfigShieldedInstanceConfig,
    ContainerClusterNodeConfigWorkloadMetadataConfig,
    ContainerClusterPrivateClusterConfig,
    ContainerClusterReleaseChannel,
    ContainerClusterWorkloadIdentityConfig,
)
from constructs import Construct

from infra.cdk.components.network import PODS_RANGE, SERVICES_RANGE, Network
from infra.config import Environment

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


def ray_operator_addon() -> ContainerClusterAddonsConfigRayOperatorConfig:
    return ContainerClusterAddonsConfigRayOperatorConfig(
        enabled=True,
        ray_cluster_logging_config=ContainerClusterAddonsConfigRayOperatorConfigRayClusterLoggingConfig(enabled=True),
        ray_cluster_monitoring_config=ContainerClusterAddonsConfigRayOperatorConfigRayClusterMonitoringConfig(enabled=True),
    )


class GkeCluster(Construct):
    def __init__(self, scope: Construct, id_: str, *, env: Environment, network: Network, node_service_account: str) -> None:
        super().__init__(scope, id_)
        autopilot = env.mode == "autopilot"
        mode_specific = (
            dict(
                enable_autopilot=True,
                cluster_autoscaling=ContainerClusterClusterAutoscaling(
                    auto_provisioning_defaults=ContainerClusterClusterAutoscalingAutoProvisioningDefaults(
                        service_account=node_service_account, oauth_scopes=[CLOUD_PLATFORM]
                    )
                ),
            )
            if autopilot
            else dict(
                # The default pool cannot be configured well; drop it and declare our own. A regional
                # cluster's default pool would take a node in every zone of the region: one zone.
                remove_default_node_pool=True,
                initial_node_count=1,
                node_locations=[env.zone] if env.cluster_type == "regional" else None,
                enable_shielded_nodes=True,
                enable_intranode_visibility=True,
                node_config=ContainerClusterNodeConfig(
                    service_account=node_service_account,
                    oauth_scopes=[CLOUD_PLATFORM],
                    shielded_instance_config=ContainerClusterNodeConfigShieldedInstanceConfig(
                        enable_secure_boot=True, enable_integrity_monitoring=True
                    ),
                    workload_metadata_config=ContainerClusterNodeConfigWorkloadMetadataConfig(mode="GKE_METADATA"),
                ),
            )
        )
        self.cluster = ContainerCluster(
            self,
            "cluster",
            name=env.cluster_name,
            location=env.location,
            network=network.vpc.id,
            subnetwork=network.subnet.id,
            deletion_protection=env.deletion_protection,
            release_channel=ContainerClusterReleaseChannel(channel=env.release_channel),
            # The oldest version the cluster may start on, where a feature needs one (infra.rules).
            min_master_version=env.gke_min_version,
            resource_labels=env.labels,
            datapath_provider="ADVANCED_DATAPATH",  # Dataplane V2: enforces NetworkPolicy
            ip_allocation_policy=ContainerClusterIpAllocationPolicy(
                cluster_secondary_range_name=PODS_RANGE, services_secondary_range_name=SERVICES_RANGE
            ),
            private_cluster_config=ContainerClusterPrivateClusterConfig(
                enable_private_nodes=True,
                # The IP endpoint stays public, limited to master_authorized_networks (empty by
                # default: nobody); the DNS endpoint below is the documented way in from outside.
                enable_private_endpoint=False,
                master_ipv4_cidr_block=str(env.network.master_cidr),
            ),
            # The DNS-based endpoint: reachable wherever Google's APIs are (laptops, Cloud Build's
            # default pool), authorized by IAM (container.clusters.connect), not by source address.
            control_plane_endpoints_config=ContainerClusterControlPlaneEndpointsConfig(
                dns_endpoint_config=ContainerClusterControlPlaneEndpointsConfigDnsEndpointConfig(
                    allow_external_traffic=env.network.dns_endpoint
                )
            ),
            master_authorized_networks_config=ContainerClusterMasterAuthorizedNetworksConfig(
                cidr_blocks=[
                    ContainerClusterMasterAuthorizedNetworksConfigCidrBlocks(cidr_block=str(c), display_name=f"authorized-{i}")
                    for i, c in enumerate(env.network.master_authorized_networks)
                ]
            ),
            master_auth=ContainerClusterMasterAuth(
                client_certificate_config=ContainerClusterMasterAuthClientCertificateConfig(issue_client_certificate=False)
            ),
            workload_identity_config=ContainerClusterWorkloadIdentityConfig(workload_pool=f"{env.project}.svc.id.goog"),
            addons_config=ContainerClusterAddonsConfig(
                ray_operator_config=[ray_operator_addon()],
                # Lets Ray pods mount the checkpoint bucket (and, for serving, model weights).
                gcs_fuse_csi_driver_config=ContainerClusterAddonsConfigGcsFuseCsiDriverConfig(enabled=True),
            ),
            logging_config=ContainerClusterLoggingConfig(enable_components=["SYSTEM_COMPONENTS", "WORKLOADS"]),
            monitoring_config=ContainerClusterMonitoringConfig(
                enable_components=["SYSTEM_COMPONENTS"],
                managed_prometheus=ContainerClusterMonitoringConfigManagedPrometheus(enabled=True),
            ),
            binary_authorization=ContainerClusterBinaryAuthorization(evaluation_mode="PROJECT_SINGLETON_POLICY_ENFORCE"),
            **mode_specific,
        )

    @property
    def name(self) -> str:
        return self.cluster.name

    @property
    def id(self) -> str:
        return self.cluster.id
