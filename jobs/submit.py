"""Submit a workload to a Ray cluster from a laptop or a Cloud Build stage.

  python -m jobs.submit healthcheck --env dev [--address URL] [--timeout S] [--request-timeout S] [--tpu-image REF] [-- job args...]
  python -m jobs.submit train --env dev --tpu-image REF --print-rayjob | --rayjob [--slice-group G] [--name N] [-- job args...]

Without an address (`--address` or RAY_ADDRESS) it gets the environment's cluster credentials,
port-forwards the RayCluster head's dashboard port (8265) to 127.0.0.1, submits through the Ray Jobs
API with the repo as working dir and the config's runtime env, follows the logs, and exits with the
job's status (0 succeeded, 1 failed or stopped, 2 could not submit, 3 timed out). The port-forward is
always closed.

Every Jobs API request is bounded (`jobs.client.jobs_api`): a stall before the job exists exits 2;
once it exists, the job is stopped (bounded too) and the exit is 3.

Ray token authentication is on for every cluster. Through the port-forward, the token is read from
the RayCluster's Secret with kubectl into this process's environment (`jobs.client.tokens`); with
`--address`, it comes from the environment (RAY_AUTH_MODE=token and RAY_AUTH_TOKEN or
RAY_AUTH_TOKEN_PATH, e.g. `eval "$(python -m jobs.local env)"` for the simulated slice). A missing or
wrong token is one line saying how to get the right one (exit 2).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from pathlib import Path

from infra.config import ConfigError, Environment, SliceGroup, environment_names, load_environment
from infra.images import is_project_tpu_image
from infra.manifests import checks, dump_all
from infra.manifests.kueue import kueue_manifests
from infra.manifests.kueue_admission import never_admitted
from infra.manifests.rayjob import TTL_AFTER_FINISHED_S, RayJobError, RayJobRequest, rayjob_manifests
from infra.names import auth_secret_name, credentials_command
from jobs.cli import JobArgumentParser, SliceTarget, positive_seconds
from jobs.client import tokens
from jobs.client.jobs_api import CONNECT_S, READ_S, TERMINAL, NotAuthorized, SubmitError, submit
from jobs.client.port_forward import port_forward
from jobs.client.uploads import runtime_env
from jobs.runtime.auth import use_token

WORKLOADS = ("healthcheck", "train", "batch")
# Workloads that run vLLM: their RayJob runs the serving image (--serve-image), not the TPU image.
SERVING_WORKLOADS = ("batch",)


def shape_args(env: Environment, group: SliceGroup | None = None, slices: int | None = None) -> list[str]:
    """The job's slice comes from a slice group of the config, the first by default (job args after
    `--` override)."""
    group = group or env.slice_groups[0]
    args = [
        "--generation",
        group.generation,
        "--topology",
        group.topology,
        "--chips-per-host",
        str(group.shape.chips_per_host),
        "--slices",
        str(group.slices if slices is None else slices),
    ]
    if env.name in environment_names():  # the cluster has the shipped configs in the working dir
        args = ["--env", env.name, *args]
    return args


def rayjob_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of `--print-rayjob` / `--rayjob`: a RayJob per job (infra.manifests.rayjob)."""
    group = parser.add_argument_group("a RayJob per job (its own Ray cluster, queued by Kueue where the config has it)")
    group.add_argument(
        "--print-rayjob", action="store_true", help="print the job's RayJob and its NetworkPolicy (kubectl apply -f -) and exit"
    )
    group.add_argument("--rayjob", action="store_true", help="apply the job's RayJob, follow it to the end, exit with the job's status")
    group.add_argument(
        "--slice-group",
        metavar="NAME",
        help="the slice group it runs on (default: the first that leaves slices to RayJobs, else the first)",
    )
    group.add_argument(
        "--name",
        metavar="NAME",
        help="the RayJob's name, and the train run's unless the job's own args name it (default: <job>-<8 random hex>; "
        "at most 47 characters, 35 on a multi-host slice)",
    )
    group.add_argument(
        "--kueue-objects",
        metavar="FILE",
        help="the ResourceFlavors and ClusterQueue to check the job's admission against, e.g. the cluster's own "
        "(`kubectl get resourceflavors,clusterqueues -o yaml`) (default: the environment's, as `python -m infra manifests` prints them)",
    )
    group.add_argument(
        "--active-deadline",
        type=positive_seconds,
        default=86400.0,
        metavar="SECONDS",
        help="the RayJob's activeDeadlineSeconds (default 86400)",
    )
    group.add_argument(
        "--pre-running-deadline",
        type=positive_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="the RayJob's preRunningDeadlineSeconds: from its start to the job running (default 3600)",
    )
    group.add_argument(
        "--ttl",
        type=positive_seconds,
        default=float(TTL_AFTER_FINISHED_S),
        metavar="SECONDS",
        help=f"ttlSecondsAfterFinished: how long the finished job's cluster (and its TPUs) stay for a look (default {TTL_AFTER_FINISHED_S})",
    )
    group.add_argument(
        "--priority",
        metavar="NAME",
        help="the job's Kueue WorkloadPriorityClass, one of the config's kueue.priorities (default: kueue.default_priority)",
    )


def rayjob_group(env: Environment, name: str | None) -> SliceGroup:
    """The slice group the RayJob takes: `--slice-group`, else the first that leaves slices to
    RayJobs. A group that leaves none is refused: its slices belong to the RayCluster (and the
    RayService), and a RayJob would wait on them, or take one from under a running job."""
    takers = [g.name for g in env.slice_groups if g.rayjob_slices]
    valid = f"groups that do: {', '.join(takers)}" if takers else "none of its groups does"
    if name is None:
        if not takers:
            raise RayJobError(
                f"--slice-group: environment {env.name} leaves no slices to RayJobs (every group's rayjob_slices is 0): "
                "set rayjob_slices on a slice group, or run the job on the RayCluster (python -m jobs.submit JOB without --rayjob)"
            )
        return env.slice_group(takers[0])
    names = [g.name for g in env.slice_groups]
    if name not in names:
        raise RayJobError(f"--slice-group: no slice group {name!r} in environment {env.name}; valid: {', '.join(names)}")
    if name not in takers:
        index = names.index(name)
        raise RayJobError(
            f"--slice-group: slice group {name} leaves no slices to RayJobs (slice_groups[{index}].rayjob_slices is 0 in "
            f"environment {env.name}); {valid}"
        )
    return env.slice_group(name)


def with_run_name(job: str, job_args: list[str], name: str) -> list[str]:
    """The job's arguments with its run named after the RayJob, for a job whose runs are named
    (its module's RUN_NAME_FLAG), unless the arguments already name it: the user's name wins."""
    import importlib

    flag = getattr(importlib.import_module(f"jobs.{job}"), "RUN_NAME_FLAG", None)
    if flag is None or any(a == flag or a.startswith(f"{flag}=") for a in job_args):
        return job_args
    return [*job_args, flag, name]


def priority_of(env: Environment, given: str | None) -> str | None:
    """The job's WorkloadPriorityClass: `given`, else the config's default; None without Kueue."""
    if env.kueue is None:
        if given is not None:
            raise RayJobError(f"--priority: environment {env.name} has no `kueue` section, so no priorities; leave --priority out")
        return None
    name = given or env.kueue.default_priority
    if name not in env.kueue.priorities:
        listed = ", ".join(f"{n} ({v})" for n, v in env.kueue.priorities.items())
        raise RayJobError(f"--priority: {name!r} is not a priority of environment {env.name}; valid: {listed}")
    return name


def rayjob_docs(env: Environment, args: argparse.Namespace) -> list[dict]:
    """The job as a RayJob (and its NetworkPolicy): the job's flags checked by its own parser first,
    then KubeRay's and Kueue's rules (infra.manifests.checks). A RayJobError or ConfigError for
    what is wrong; exits 2 on a bad job flag."""
    import secrets

    group = rayjob_group(env, args.slice_group)
    priority = priority_of(env, args.priority)
    image = None
    if args.job in SERVING_WORKLOADS:
        image = getattr(args, "serve_image", None) or getattr(env.serving, "image", None)
        if not image:
            raise RayJobError(
                f"--serve-image: a {args.job} RayJob runs vLLM, which lives in the serving image; pass --serve-image "
                "(e.g. $(cat build/images/serve.ref) after `make images`), or set serving.image in the environment"
            )
    name = args.name or f"{args.job}-{secrets.token_hex(4)}"
    if problems := checks.rayjob_name(name):
        raise RayJobError(f"--name: {problems[0]}")
    job_argv = [*shape_args(env, group, slices=1), *with_run_name(args.job, args.job_args, name)]
    target, requirements = check_job_args(args.job, job_argv)
    if (target.shape.generation, target.shape.topology) != (group.shape.generation, group.topology):
        raise RayJobError(f"--topology: the job asks for {target.shape}, but slice group {group.name} is {group.shape}; pass --slice-group")
    request = RayJobRequest(
        name=name,
        job=args.job,
        entrypoint=shlex.join(["python", "-m", f"jobs.{args.job}", *job_argv]),
        group=group.name,
        slices=target.slices,
        active_deadline_s=int(args.active_deadline),
        pre_running_deadline_s=int(args.pre_running_deadline),
        ttl_after_finished_s=int(args.ttl),
        env_vars={**env.ray.job_env_vars, **dict(kv.split("=", 1) for kv in args.env_var)},
        pip=() if image else tuple(dict.fromkeys([*env.ray.job_pip, *job_requirements(env, group.generation, requirements)])),
        priority=priority,
        image=image,
        mount_bucket=image is not None,  # vLLM reads a gs:// model through the bucket's mount
    )
    docs = rayjob_manifests(env, request)
    job = docs[-1]
    if problems := [*checks.kuberay_rayjob(job), *checks.kueue_rayjob(job), *checks.tpu_webhook_names(job)]:
        raise RayJobError(f"the RayJob would be refused: {problems[0]}")
    if env.kueue is not None and (why := never_admitted(job, queue_objects(env, args.kueue_objects))):
        raise RayJobError(f"the RayJob would queue forever: {why}")
    return docs


def queue_objects(env: Environment, path: str | None) -> list[dict]:
    """The Kueue objects a job's admission is checked against: the environment's own, or those in
    `path` (YAML documents, or a `kind: List` as kubectl prints it)."""
    if path is None:
        return kueue_manifests(env)
    import yaml

    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text(encoding="utf-8")) if isinstance(d, dict)]
    except (OSError, yaml.YAMLError) as err:
        raise RayJobError(f"--kueue-objects: cannot read {path}: {' '.join(str(getattr(err, 'strerror', None) or err).split())}") from None
    docs = [item for d in docs for item in (d.get("items") or [] if d.get("kind", "").endswith("List") else [d])]
    queues = [d for d in docs if d.get("kind") == "ClusterQueue" and d.get("metadata", {}).get("name") == env.cluster_queue_name]
    if not queues:
        raise RayJobError(f"--kueue-objects: {path} holds no ClusterQueue {env.cluster_queue_name} (the environment's kueue.cluster_queue)")
    return [*queues, *(d for d in docs if d.get("kind") == "ResourceFlavor")]


def as_rayjob(env: Environment, args: argparse.Namespace) -> int:
    try:
        docs = rayjob_docs(env, args)
    except (RayJobError, ConfigError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    if args.print_rayjob:
        sys.stdout.write(dump_all(docs))
        return 0
    from jobs.client.rayjob import run_rayjob

    return run_rayjob(env, docs, timeout_s=args.timeout)


def token_hint(env: Environment, explicit_address: bool) -> str:
    if not explicit_address:
        return f"the token came from Secret {auth_secret_name(env)}: was the RayCluster re-created since? run again, or check `kubectl get raycluster -n {env.ray.namespace}`"
    return (
        f"export the cluster's token first: for GKE, {tokens.export_line(env)} "
        '(`python -m jobs.submit --print-token-command` prints it); for the simulated slice, eval "$(python -m jobs.local env)"'
    )


def check_job_args(job: str, argv: list[str]) -> tuple[SliceTarget, tuple[str, ...]]:
    """Parse the job's arguments here, as the job will on the cluster, so a bad flag fails now (exit 2,
    one paragraph naming it) rather than minutes later on the cluster: (the slices it runs on, the
    job's own pip requirements, its module's REQUIREMENTS)."""
    import importlib

    module = importlib.import_module(f"jobs.{job}")
    parsed = module.parse_args(argv)
    target = next(p for p in parsed if isinstance(p, SliceTarget))
    return target, tuple(getattr(module, "REQUIREMENTS", ()))


def job_requirements(env: Environment, generation: str, requirements: tuple[str, ...]) -> tuple[str, ...]:
    """What the runtime env must pip-install for the job: nothing when its hosts run the project's
    TPU image, which carries exactly the jobs' requirements (images/tpu.Dockerfile)."""
    return () if is_project_tpu_image(env.ray.worker_image(generation)) else requirements


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = JobArgumentParser(prog="python -m jobs.submit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", nargs="?", help="a workload module of jobs/, e.g. healthcheck or train")
    parser.add_argument("--env", default="dev", help="environment config (infra/environments/<env>.yaml)")
    parser.add_argument(
        "--address", default=os.environ.get("RAY_ADDRESS"), help="Ray dashboard URL (default: RAY_ADDRESS, else port-forward)"
    )
    parser.add_argument("--timeout", type=positive_seconds, default=3600, help="seconds to wait for the job to finish")
    parser.add_argument(
        "--request-timeout",
        type=positive_seconds,
        default=READ_S,
        metavar="SECONDS",
        help=f"seconds any one Jobs API request may wait for the dashboard (default {READ_S:g}; at most --timeout)",
    )
    parser.add_argument("--env-var", action="append", default=[], metavar="KEY=VALUE", help="extra runtime env variable")
    parser.add_argument(
        "--tpu-image",
        metavar="REF",
        help="the image the cluster's TPU hosts run, when not the config's (ray.tpu_images): the project's own "
        "(images/tpu.Dockerfile) already carries the jobs' requirements, so the job installs none",
    )
    parser.add_argument(
        "--serve-image",
        metavar="REF",
        help="the image a batch RayJob runs (vLLM lives there), when not the config's serving.image: the project's own "
        "(images/serve.Dockerfile)",
    )
    rayjob_flags(parser)
    parser.add_argument("--print-credentials-command", action="store_true", help="print the gcloud get-credentials command and exit")
    parser.add_argument(
        "--print-token-command",
        action="store_true",
        help="print the shell line that exports the RayCluster's token from its Secret (for `ray job submit`) and exit",
    )
    ours, job_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(ours)
    args.job_args = job_args
    bad = [kv for kv in args.env_var if "=" not in kv]
    if bad:
        parser.error(f"--env-var takes KEY=VALUE, got {bad[0]!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        env = load_environment(args.env, tpu_image=args.tpu_image)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.print_credentials_command:
        print(shlex.join(credentials_command(env)))
        return 0
    if args.print_token_command:
        print(tokens.export_line(env))
        return 0
    if args.job not in WORKLOADS:
        which = f"job {args.job!r} is not a workload" if args.job else "no job given"
        print(f"error: {which}; valid: {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    if args.print_rayjob or args.rayjob:
        return as_rayjob(env, args)
    if args.job in SERVING_WORKLOADS:
        print(
            f"error: {args.job} runs vLLM, which the environment's TPU RayCluster does not have: submit it as a RayJob on the "
            "serving image (--print-rayjob or --rayjob with --serve-image), or with `ray job submit` to a cluster that has vLLM",
            file=sys.stderr,
        )
        return 2
    job_argv = [*shape_args(env), *args.job_args]
    target, requirements = check_job_args(args.job, job_argv)  # exits 2 on a bad flag, before any upload
    generation = target.shape.generation.name
    requirements = job_requirements(env, generation, requirements)
    entrypoint = shlex.join(["python", "-m", f"jobs.{args.job}", *job_argv])
    env_vars = dict(kv.split("=", 1) for kv in args.env_var)
    pip = runtime_env(env, env_vars, requirements).get("pip", [])
    image = env.ray.worker_image(generation)
    print(f"image {image}; every host installs {' '.join(pip) if pip else 'nothing'} at the job's start", flush=True)
    try:
        with contextlib.nullcontext(args.address) if args.address else port_forward(env) as address:
            if not args.address:  # the environment's own RayCluster: its token from its Secret
                use_token(token=tokens.read_token(env))
            # No single request may wait longer than the whole job may take.
            read_s = min(args.request_timeout, args.timeout)
            status = submit(
                address, entrypoint, env, env_vars, args.timeout, connect_s=min(CONNECT_S, read_s), read_s=read_s, job_pip=requirements
            )
    except NotAuthorized as err:
        print(f"error: {err}; {token_hint(env, bool(args.address))}", file=sys.stderr)
        return 2
    except SubmitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except TimeoutError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    except (OSError, RuntimeError) as err:  # the dashboard went away, or answered an error, mid-way
        where = args.address or "the port-forwarded Ray head"
        print(f"error: the Ray Jobs API at {where} failed: {' '.join(str(err).split()) or type(err).__name__}", file=sys.stderr)
        return 2
    print(f"job {status.lower()}", flush=True)
    return TERMINAL[status]


if __name__ == "__main__":
    sys.exit(main())
