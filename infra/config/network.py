"""The config's network: the VPC's ranges and who may reach the control plane."""

from __future__ import annotations

from ipaddress import IPv4Network

from pydantic import field_validator, model_validator

from infra.config.fields import Cidr, Strict


class Network(Strict):
    subnet_cidr: Cidr = IPv4Network("10.10.0.0/20")
    pods_cidr: Cidr = IPv4Network("10.16.0.0/14")
    services_cidr: Cidr = IPv4Network("10.20.0.0/20")
    master_cidr: Cidr = IPv4Network("172.16.0.32/28")
    # Who may reach the control plane's IP endpoint. Empty: nobody outside the VPC.
    master_authorized_networks: list[Cidr] = []
    # The DNS-based control-plane endpoint, reachable from anywhere Google's APIs are (laptops,
    # Cloud Build's default pool) and guarded by IAM (container.clusters.connect), not by address.
    # kubectl credentials then use `get-credentials --dns-endpoint`.
    dns_endpoint: bool = True

    @field_validator("master_cidr")
    @classmethod
    def _master_is_28(cls, value: IPv4Network) -> IPv4Network:
        if value.prefixlen != 28:
            raise ValueError(f"GKE needs a /28 for the control plane, got /{value.prefixlen}")
        return value

    @model_validator(mode="after")
    def _no_overlap(self) -> Network:
        ranges = {
            "subnet_cidr": self.subnet_cidr,
            "pods_cidr": self.pods_cidr,
            "services_cidr": self.services_cidr,
            "master_cidr": self.master_cidr,
        }
        names = list(ranges)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                if ranges[a].overlaps(ranges[b]):
                    raise ValueError(f"{a} {ranges[a]} overlaps {b} {ranges[b]}: each range must be disjoint")
        return self
