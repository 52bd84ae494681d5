"""`python -m infra`: the parts of the infrastructure that need no cdktf import.

python -m infra manifests --env dev     print the ServiceAccount, RayCluster, RayService and NetworkPolicies (kubectl apply -f -)
python -m infra show --env dev          what the environment declares, shape by shape
python -m infra envs                    list the environments
python -m infra bootstrap --env dev     print the commands that create the Terraform state bucket and the image repository (once)
python -m infra images --env dev        print the script that builds and pushes the TPU and serving images (`make images`)

`manifests` and `show` take `--tpu-image REF` and `--serve-image REF`: the images a build produced
(Cloud Build's images stage), in place of the config's `ray.tpu_images` and `serving.image`.
"""

from __future__ import annotations

import argparse
import sys

from infra import images
from infra.catalog import CatalogError
from infra.config import ConfigError, Environment, Peer, environment_names, load_environment
from infra.manifests import dump_all
from infra.manifests.kueue import kueue_manifests
from infra.manifests.raycluster import cluster_slices, manifests
from infra.names import auth_secret_name
from infra.node_pools import tpu_pool_plans
from infra.platform_facts import KUBERAY_AUTH
from infra.serving import ray_serve_base


def _show(env: Environment) -> str:
    """One screen for a reviewer: the plan's size per slice group, its pools, and its risks."""
    kind = f"{env.cluster_type} {env.mode}" if env.mode == "standard" else env.mode
    lines = [
        f"environment {env.name}: stack {env.stack_name}, {kind} cluster {env.cluster_name} in {env.location} "
        f"(project {env.project}), GKE >= {env.gke_min_version or 'channel default'} ({env.release_channel}), "
        f"bucket gs://{env.bucket_name}"
    ]
    total_chips, total_flops = 0, 0.0
    for group in env.slice_groups:
        shape, n = group.shape, group.slices
        cpu, memory = group.requests
        image = env.ray.worker_image(group.generation)
        carries = (
            "carries the jobs' requirements" if images.is_project_tpu_image(image) else "jobs pip-install theirs at start; `make images`"
        )
        ours = cluster_slices(env, group)
        serving = n - ours - group.rayjob_slices
        split = f"{ours} for the RayCluster" + (f", {serving} for the RayService" if serving else "")
        if group.rayjob_slices:
            queue = (
                f"queued by Kueue: LocalQueue {env.kueue.local_queue} -> ClusterQueue {env.cluster_queue_name}"
                if env.kueue is not None
                else "no Kueue: each waits for the pool"
            )
            split += f", {group.rayjob_slices} for RayJobs ({queue})"
        lines.append(
            f"  slice group {group.name}: {n} x {shape}, in {env.group_zone(group)}, capacity {group.capacity_kind}, "
            f"min {group.min_slices} slice(s); {split}"
        )
        lines.append(
            f"    {n * shape.chips} chips on {n * shape.hosts} hosts, {n * shape.peak_bf16_flops / 1e15:.1f} PFLOP/s "
            f"peak bf16, {n * shape.hbm_bytes / 2**30:,.0f} GiB HBM; each pod requests cpu {cpu}, memory {memory}, "
            f"{shape.chips_per_host} TPU chips; image {image} ({carries})"
        )
        total_chips += n * shape.chips
        total_flops += n * shape.peak_bf16_flops
    lines.append(f"  in all: {total_chips} chips, {total_flops / 1e15:.1f} PFLOP/s peak bf16")
    for plan in tpu_pool_plans(env):
        size = f"{plan.min_nodes}-{plan.max_nodes} nodes" if plan.autoscaled else f"{plan.initial_nodes} nodes"
        lines.append(
            f"  node pool {plan.name}: {plan.machine_type} in {plan.zone}, {size}, "
            f"placement {plan.placement or 'none'}, auto-repair {'on' if plan.auto_repair else 'off'}"
        )
    access = env.ray.access

    def peers(allowed: list[Peer]) -> str:
        return ", ".join(f"{p.namespace or env.ray.namespace}{p.pod_labels or ''}" for p in allowed) or "none (kubectl port-forward)"

    mode = next(f for f in KUBERAY_AUTH if f.field == "authOptions.mode")
    lines.append(
        f"  access: Ray {access.auth} authentication ({mode.field}, KubeRay >= {mode.since}; token in Secret {auth_secret_name(env)}); "
        f"dashboard from {peers(access.dashboard_from)}; Serve from {peers(access.serve_from)}"
    )
    warnings = env.warnings
    lines.extend(f"  warning: {w}" for w in warnings)
    if not warnings:
        lines.append("  warnings: none")
    return "\n".join(lines)


def _bootstrap(env_name: str) -> str:
    """The one step before the first build and `cdktf deploy`: the Artifact Registry repository that
    Cloud Build's first step pushes to, and the Terraform state bucket (both idempotent). Not in the
    stack: they must exist before any Terraform runs (the state lives in one, the builder in the other)."""
    env = load_environment(env_name)
    repository = images.repository_command(env.project, env.region)
    if not env.state_bucket:
        return repository + f"# {env.name} keeps Terraform state locally: no state bucket to create\n"
    b, p = f"gs://{env.state_bucket}", env.project
    return repository + (
        f"gcloud storage buckets describe {b} --project {p} >/dev/null 2>&1 || "
        f"gcloud storage buckets create {b} --project {p} --location {env.region} "
        f"--uniform-bucket-level-access --public-access-prevention\n"
        f"gcloud storage buckets update {b} --versioning\n"
    )


def _images(env: Environment, tag: str, registry: str | None) -> str:
    """The build script for the environment's TPU and serving images (infra.images.build_script)."""
    bases = {env.ray.worker_image(g.generation) for g in env.slice_groups}
    tpu_bases = sorted(b for b in bases if not images.is_project_tpu_image(b)) or [env.ray.default_worker_image]
    if len(tpu_bases) > 1:
        raise ConfigError(
            f"environment {env.name!r}",
            [f"ray.tpu_images: one TPU image serves every generation, but the config names {', '.join(tpu_bases)}; use one base"],
        )
    reg = registry or images.registry(env.project, env.region)
    return images.build_script(images.project_builds(reg, tpu_bases[0], ray_serve_base(env), tag))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in (
        ("manifests", "print the Kubernetes manifests"),
        ("show", "summarise an environment"),
        ("bootstrap", "print the commands that create the image repository and the state bucket"),
        ("images", "print the script that builds and pushes the TPU and serving images"),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--env", default="dev", help=f"environment name ({', '.join(environment_names())}) or a .yaml path")
        if name in ("manifests", "show"):
            p.add_argument("--tpu-image", metavar="REF", help="the TPU workers' image (every generation), e.g. the build's name@sha256:...")
            p.add_argument("--serve-image", metavar="REF", help="the serving image (serving.image)")
        if name == "images":
            p.add_argument("--tag", default="dev", help="the images' tag (Cloud Build passes its BUILD_ID)")
            p.add_argument("--registry", help="push here instead of <location>-docker.pkg.dev/<project>/ray-tpu-gke")
    sub.add_parser("envs", help="list the environments")
    args = parser.parse_args(argv)
    try:
        if args.command == "manifests":
            # Build everything before printing anything: a bad config leaves stdout empty.
            env = load_environment(args.env, tpu_image=args.tpu_image, serve_image=args.serve_image)
            docs = manifests(env)
            if env.serving is not None:
                from infra.manifests.network_policy import network_policy
                from infra.manifests.rayservice import ray_service, ray_service_name

                docs.append(ray_service(env))
                docs.append(network_policy(env, ray_service_name(env), serving=True))
            docs.extend(kueue_manifests(env))
            out = dump_all(docs)
            for warning in env.warnings:
                print(f"warning: {warning}", file=sys.stderr)
        elif args.command == "show":
            out = _show(load_environment(args.env, tpu_image=args.tpu_image, serve_image=args.serve_image)) + "\n"
        elif args.command == "images":
            out = _images(load_environment(args.env), args.tag, args.registry)
        elif args.command == "bootstrap":
            out = _bootstrap(args.env)
        else:
            out = "\n".join(environment_names()) + "\n"
    except (ConfigError, CatalogError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
