"""VPC, subnet with pod/service secondary ranges, and Cloud Router + NAT so private nodes can pull
images and reach Google APIs without public IPs."""

from __future__ import annotations

from cdktf_cdktf_provider_google.compute_firewall import ComputeFirewall, ComputeFirewallAllow, ComputeFirewallLogConfig
from cdktf_cdktf_provider_google.compute_network import ComputeNetwork
from cdktf_cdktf_provider_google.compute_router import ComputeRouter
from cdktf_cdktf_provider_google.compute_router_nat import ComputeRouterNat, ComputeRouterNatLogConfig
from cdktf_cdktf_provider_google.compute_subnetwork import (
    ComputeSubnetwork,
    ComputeSubnetworkLogConfig,
    ComputeSubnetworkSecondaryIpRange,
)
from constructs import Construct

from infra.config import Environment

PODS_RANGE = "pods"
SERVICES_RANGE = "services"


class Network(Construct):
    def __init__(self, scope: Construct, id_: str, *, env: Environment) -> None:
        super().__init__(scope, id_)
        name = env.cluster_name
        self.vpc = ComputeNetwork(self, "vpc", name=f"{name}-vpc", auto_create_subnetworks=False, routing_mode="REGIONAL")
        self.subnet = ComputeSubnetwork(
            self,
            "subnet",
            name=f"{name}-nodes",
            network=self.vpc.id,
            region=env.region,
            ip_cidr_range=str(env.network.subnet_cidr),
            private_ip_google_access=True,
            secondary_ip_range=[
                ComputeSubnetworkSecondaryIpRange(range_name=PODS_RANGE, ip_cidr_range=str(env.network.pods_cidr)),
                ComputeSubnetworkSecondaryIpRange(range_name=SERVICES_RANGE, ip_cidr_range=str(env.network.services_cidr)),
            ],
            log_config=ComputeSubnetworkLogConfig(
                aggregation_interval="INTERVAL_10_MIN", flow_sampling=0.5, metadata="INCLUDE_ALL_METADATA"
            ),
        )
        # Nodes and pods talk freely inside the VPC (Ray's GCS, object store and the multislice
        # megascale port); nothing from outside comes in but what GKE itself opens.
        internal = [str(env.network.subnet_cidr), str(env.network.pods_cidr)]
        self.internal_firewall = ComputeFirewall(
            self,
            "allow-internal",
            name=f"{name}-allow-internal",
            network=self.vpc.id,
            direction="INGRESS",
            source_ranges=internal,
            allow=[ComputeFirewallAllow(protocol="tcp"), ComputeFirewallAllow(protocol="udp"), ComputeFirewallAllow(protocol="icmp")],
            log_config=ComputeFirewallLogConfig(metadata="INCLUDE_ALL_METADATA"),
        )
        self.router = ComputeRouter(self, "router", name=f"{name}-router", network=self.vpc.id, region=env.region)
        self.nat = ComputeRouterNat(
            self,
            "nat",
            name=f"{name}-nat",
            router=self.router.name,
            region=env.region,
            nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
            log_config=ComputeRouterNatLogConfig(enable=True, filter="ERRORS_ONLY"),
        )
