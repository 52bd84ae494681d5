"""What every node pool of ours shares: our node service account (not the default compute one),
shielded VMs, the GKE metadata server for Workload Identity, COS, and auto repair/upgrade."""

from __future__ import annotations

from typing import Any

from cdktf_cdktf_provider_google.container_node_pool import (
    ContainerNodePoolManagement,
    ContainerNodePoolNodeConfig,
    ContainerNodePoolNodeConfigShieldedInstanceConfig,
    ContainerNodePoolNodeConfigWorkloadMetadataConfig,
)

from infra.cdk.components.cluster import CLOUD_PLATFORM
from infra.config import Environment


def node_config(env: Environment, service_account: str, machine_type: str, **extra: Any) -> ContainerNodePoolNodeConfig:
    return ContainerNodePoolNodeConfig(
        machine_type=machine_type,
        service_account=service_account,
        oauth_scopes=[CLOUD_PLATFORM],
        image_type="COS_CONTAINERD",
        shielded_instance_config=ContainerNodePoolNodeConfigShieldedInstanceConfig(
            enable_secure_boot=True, enable_integrity_monitoring=True
        ),
        workload_metadata_config=ContainerNodePoolNodeConfigWorkloadMetadataConfig(mode="GKE_METADATA"),
        resource_labels=env.labels,
        **extra,
    )


def management(auto_repair: bool = True) -> ContainerNodePoolManagement:
    return ContainerNodePoolManagement(auto_repair=auto_repair, auto_upgrade=True)
