"""What every workload's command line shares: the flags and how they turn into a validated slice
target, joining the Ray cluster, and the tail of the output (a summary, the attempts, and one
`NAME {json}` result line that `jobs.demo` and the benchmarks parse back with `parse_result`).

`--env` (default `dev`) names an environment config (`infra/environments/<env>.yaml`); its first slice
group gives the defaults for `--generation`, `--topology`, `--chips-per-host` and `--slices`, so a
job submitted without flags targets the slice that environment deploys. Explicit flags win.

Bad arguments exit with status 2 and one paragraph that names the flag and the valid choices, never
a traceback: the catalog's and the config's own errors already list the choices, we only add which
flag they came from.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from infra import catalog
from infra.argtypes import non_negative_int, non_negative_seconds, positive_int, positive_number, positive_seconds, whole_number
from infra.config import ConfigError, Environment, load_environment
from jobs.runtime.inventory import DEFAULT_RESERVE_TIMEOUT_S
from jobs.runtime.outcomes import Cancelled, Succeeded
from jobs.runtime.reruns import RunReport

# The argument types are part of this module's API (the workloads' parsers use them from here).
__all__ = ["non_negative_int", "non_negative_seconds", "positive_int", "positive_number", "positive_seconds", "whole_number"]

DEFAULT_ENV = "dev"


class JobArgumentParser(argparse.ArgumentParser):
    """argparse, but errors are one paragraph (no usage dump) and exit 2."""

    def error(self, message: str) -> NoReturn:
        one_paragraph = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
        self.exit(2, f"{self.prog}: error: {one_paragraph} (see {self.prog} --help)\n")


@dataclass(frozen=True)
class SliceTarget:
    """What a workload runs on: `slices` identical slices of one shape."""

    shape: catalog.SliceShape
    slices: int
    reserve_timeout_s: float | None  # None for commands that do not reserve (jobs.local)
    env_name: str | None  # None when the environment config could not be loaded and was not needed
    bucket_name: str | None  # the environment's GCS bucket, for checkpoints

    @property
    def hosts(self) -> int:
        """Hosts over all slices: one Ray worker (and one JAX process) each."""
        return self.shape.hosts * self.slices

    @property
    def peak_bf16_flops(self) -> float:
        return self.shape.peak_bf16_flops * self.slices

    def describe(self) -> str:
        return f"{self.slices} x {self.shape}"


def add_slice_flags(parser: argparse.ArgumentParser, *, reserve_timeout: bool = True) -> None:
    group = parser.add_argument_group("slice")
    group.add_argument(
        "--env",
        default=None,
        help=f"environment config whose first slice group gives the defaults (default: {DEFAULT_ENV}); "
        "a name in infra/environments or a path to a .yaml file",
    )
    group.add_argument(
        "--generation",
        default=None,
        help=f"TPU generation: {', '.join(catalog.GENERATION_NAMES)} (or an alias such as trillium, v7x)",
    )
    group.add_argument("--topology", default=None, help="slice topology, e.g. 4x4 (v6e) or 2x2x2 (v5p)")
    group.add_argument(
        "--chips-per-host",
        type=positive_int,
        default=None,
        help="only for shapes that fit one big host or several 4-chip hosts (v5e/v6e 2x4)",
    )
    group.add_argument("--slices", type=positive_int, default=None, help="number of identical slices")
    if reserve_timeout:
        group.add_argument(
            "--reserve-timeout",
            type=positive_seconds,
            default=DEFAULT_RESERVE_TIMEOUT_S,
            metavar="SECONDS",
            help=f"give up reserving the slices after this long (default: {DEFAULT_RESERVE_TIMEOUT_S:.0f}, "
            "enough for GKE to scale a slice pool up from zero)",
        )


def add_fault_flags(parser: argparse.ArgumentParser, *, step_timeout_s: float, max_failures: int = 0, max_preemptions: int = 3) -> None:
    """The retry budgets and the hang bound (see jobs/runtime/reruns.py and jobs/runtime/progress.py)."""
    group = parser.add_argument_group("faults")
    group.add_argument(
        "--max-preemptions",
        type=non_negative_int,
        default=max_preemptions,
        metavar="N",
        help=f"reruns, each on a whole slice, after a host is preempted or lost or the run hangs (default {max_preemptions})",
    )
    group.add_argument(
        "--max-failures",
        type=non_negative_int,
        default=max_failures,
        metavar="N",
        help=f"reruns after an infrastructure failure such as a crashed worker (default {max_failures}); "
        "an error in the job's own code is never rerun",
    )
    group.add_argument(
        "--step-timeout",
        type=positive_seconds,
        default=step_timeout_s,
        metavar="SECONDS",
        help=f"a step that makes no progress for this long counts as a lost host (default {step_timeout_s:.0f}; "
        "the first step includes compilation)",
    )


def _load_env(parser: argparse.ArgumentParser, args: argparse.Namespace, needed: bool) -> Environment | None:
    name = args.env or DEFAULT_ENV
    try:
        return load_environment(name)
    except ConfigError as err:
        if args.env is not None or needed:
            why = "" if args.env is not None else " (the default; it gives the defaults of the flags you left out)"
            parser.error(f"argument --env: {name!r}{why}: {err}")
        return None  # every slice flag was given and the default env is optional


def resolve_target(parser: argparse.ArgumentParser, args: argparse.Namespace) -> SliceTarget:
    """Fill the slice flags in from the environment config and validate them against the catalog."""
    needs_defaults = args.generation is None or args.topology is None or args.slices is None
    env = _load_env(parser, args, needed=needs_defaults)
    group = env.slice_groups[0] if env else None
    env_name = env.name if env else DEFAULT_ENV

    def flag_or_env(value: Any, field: str) -> Any:
        # Without an environment every slice flag was given: `_load_env` exits otherwise.
        return value if value is not None else getattr(group, field)

    try:
        gen = catalog.generation(flag_or_env(args.generation, "generation"))
    except catalog.CatalogError as err:
        parser.error(f"argument --generation: {err}" + ("" if args.generation is not None else f" (from environment {env_name!r})"))

    topology = flag_or_env(args.topology, "topology")
    from_env = "" if args.topology is not None else f" (--topology defaults to {env_name!r}'s {topology})"
    if not gen.offers(str(topology).strip().lower()):
        parser.error(
            f"argument --topology: {topology!r} is not offered for {gen.name}{from_env}; valid topologies: {gen.describe_topologies()}"
        )

    chips_per_host = args.chips_per_host
    if chips_per_host is None and group is not None and group.shape.generation == gen and group.topology == topology:
        chips_per_host = group.chips_per_host  # the config already resolved an ambiguous shape
    try:
        shape = catalog.shape(gen, topology, chips_per_host)
    except catalog.CatalogError as err:
        parser.error(f"argument --chips-per-host: {err}")

    slices = flag_or_env(args.slices, "slices")
    return SliceTarget(
        shape=shape,
        slices=slices,
        reserve_timeout_s=getattr(args, "reserve_timeout", None),
        env_name=env.name if env else None,
        bucket_name=env.bucket_name if env else None,
    )


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, SliceTarget]:
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    return args, resolve_target(parser, args)


def connect_ray() -> None:
    """Join the cluster this job was submitted to (`RAY_ADDRESS`), or exit saying what to do."""
    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(address=os.environ.get("RAY_ADDRESS") or "auto", logging_level=logging.WARNING)
    except ConnectionError as err:
        raise SystemExit(
            f"no Ray cluster to run on ({err}); submit with `ray job submit`, set RAY_ADDRESS, "
            "or start the simulation with `python -m jobs.local up`"
        ) from None


def result_line(marker: str, payload: dict[str, Any]) -> str:
    """The machine-readable line a workload prints last: `MARKER {json}`."""
    return f"{marker} {json.dumps(payload)}"


def parse_result(logs: str, marker: str) -> dict[str, Any] | None:
    """The JSON of the last `MARKER {json}` line in `logs` (pure); None if there is none."""
    found = None
    for line in logs.splitlines():
        if line.startswith(marker + " "):
            try:
                found = json.loads(line[len(marker) + 1 :])
            except json.JSONDecodeError:
                continue
    return found


def report_failure(report: RunReport, job: str) -> int:
    """Print why the run failed to stderr (`<job> FAILED (<kind>): <reason>`); the exit status (130 when
    cancelled, else 1)."""
    outcome = report.outcome
    if isinstance(outcome, Succeeded):
        raise ValueError(f"{job} succeeded: there is no failure to report")
    print(f"{job} FAILED ({outcome.kind}): {outcome.reason}", file=sys.stderr, flush=True)
    return 130 if isinstance(outcome, Cancelled) else 1


def finish(report: RunReport, job: str, marker: str, summary: Callable[[Any], str], payload: Callable[[Any], dict[str, Any]]) -> int | None:
    """The tail of a workload's output: on failure, why (and its exit status); on success, the
    summary of `report.value`, what each attempt met when there were reruns, and the result line
    (None: the caller decides the exit status)."""
    if not report.ok:
        return report_failure(report, job)
    print(summary(report.value), flush=True)
    if len(report.attempts) > 1:
        print("  attempts:\n" + "\n".join(f"    {a.describe()}" for a in report.attempts), flush=True)
    print(result_line(marker, {**payload(report.value), "attempts": len(report.attempts)}), flush=True)
    return None
