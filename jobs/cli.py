"""The flags every workload shares, and how they turn into a validated slice target.

`--env` (default `dev`) names an environment config (`infra/environments/<env>.yaml`); its first slice
group gives the defaults for `--generation`, `--topology`, `--chips-per-host` and `--slices`, so a
job submitted without flags targets the slice that environment deploys. Explicit flags win.

Bad arguments exit with status 2 and one paragraph that names the flag and the valid choices, never
a traceback: the catalog's and the config's own errors already list the choices, we only add which
flag they came from.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import NoReturn, Sequence

from infra import catalog
from infra.argtypes import non_negative_int, positive_int, positive_number, positive_seconds, whole_number  # noqa: F401 - part of this module's API
from infra.config import ConfigError, Environment, load_environment

DEFAULT_ENV = "dev"
# Long enough for GKE to scale a multi-host TPU node pool up from zero: node provisioning, the
# TPU webhook and pulling a Ray+JAX image typically take 5-15 minutes; 30 leaves headroom.
DEFAULT_RESERVE_TIMEOUT_S = 1800.0


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


def add_fault_flags(
    parser: argparse.ArgumentParser, *, step_timeout_s: float, max_failures: int = 0, max_preemptions: int = 3
) -> None:
    """The retry budgets and the hang bound (see jobs/driver.py and jobs/progress.py)."""
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

    gen_source = "--generation" if args.generation is not None else f"environment {env.name!r}"  # type: ignore[union-attr]
    try:
        gen = catalog.generation(args.generation if args.generation is not None else group.generation)  # type: ignore[union-attr]
    except catalog.CatalogError as err:
        parser.error(f"argument --generation: {err}" + ("" if args.generation is not None else f" (from {gen_source})"))

    topology = args.topology if args.topology is not None else group.topology  # type: ignore[union-attr]
    from_env = "" if args.topology is not None else f" (--topology defaults to {env.name!r}'s {group.topology})"  # type: ignore[union-attr]
    if not gen.offers(str(topology).strip().lower()):
        parser.error(
            f"argument --topology: {topology!r} is not offered for {gen.name}{from_env}; "
            f"valid topologies: {gen.describe_topologies()}"
        )

    chips_per_host = args.chips_per_host
    if chips_per_host is None and group is not None and group.shape.generation == gen and group.topology == topology:
        chips_per_host = group.chips_per_host  # the config already resolved an ambiguous shape
    try:
        shape = catalog.shape(gen, topology, chips_per_host)
    except catalog.CatalogError as err:
        parser.error(f"argument --chips-per-host: {err}")

    slices = args.slices if args.slices is not None else group.slices  # type: ignore[union-attr]
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
