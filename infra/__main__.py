"""`python -m infra`: the parts of the infrastructure that need no cdktf import.

  python -m infra manifests --env dev     print the ServiceAccount + RayCluster YAML (kubectl apply -f -)
  python -m infra show --env dev          what the environment declares, shape by shape
  python -m infra envs                    list the environments
"""

from __future__ import annotations

import argparse
import sys

import yaml

from infra.catalog import CatalogError
from infra.config import ConfigError, environment_names, load_environment
from infra.manifests.raycluster import manifests
from infra.node_pools import tpu_pool_plans


class _PlainDumper(yaml.SafeDumper):
    """No `&id001` anchors: kubectl users read these manifests."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _block_strings(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    # Embedded YAML (the RayService's serveConfigV2) reads best as a literal block.
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_PlainDumper.add_representer(str, _block_strings)


def _show(env_name: str) -> str:
    env = load_environment(env_name)
    lines = [
        f"environment {env.name}: stack {env.stack_name}, {env.mode} cluster {env.cluster_name} in {env.location} "
        f"(project {env.project}), bucket gs://{env.bucket_name}"
    ]
    for group in env.slice_groups:
        lines.append(f"  slice group {group.name}: {group.slices} x {group.shape}, capacity {group.capacity_kind}, "
                     f"min {group.min_slices} slice(s)")
    for plan in tpu_pool_plans(env):
        size = f"{plan.min_nodes}-{plan.max_nodes} nodes" if plan.autoscaled else f"{plan.initial_nodes} nodes"
        lines.append(f"  node pool {plan.name}: {plan.machine_type}, {size}, placement {plan.placement or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in (("manifests", "print the Kubernetes manifests"), ("show", "summarise an environment")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--env", default="dev", help=f"environment name ({', '.join(environment_names())}) or a .yaml path")
    sub.add_parser("envs", help="list the environments")
    args = parser.parse_args(argv)
    try:
        if args.command == "manifests":
            # Build everything before printing anything: a bad config leaves stdout empty.
            env = load_environment(args.env)
            docs = manifests(env)
            if env.serving is not None:
                from infra.manifests.rayservice import ray_service

                docs.append(ray_service(env))
            out = yaml.dump_all(docs, Dumper=_PlainDumper, sort_keys=False)
        elif args.command == "show":
            out = _show(args.env) + "\n"
        else:
            out = "\n".join(environment_names()) + "\n"
    except (ConfigError, CatalogError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
