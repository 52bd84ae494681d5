"""The cdktf app (`cdktf.json` runs `python -m infra.app`, which calls `main`): one stack per environment.

Every environment config is validated before the provider bindings are imported or anything is
written, so a bad config fails in about a second with one line per bad field.
Set RAY_TPU_ENVS=dev,prod to synthesize only some environments.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from infra.config import ConfigError, Environment, environment_names, load_environment


def selected_environments() -> list[Environment]:
    names = [n.strip() for n in os.environ.get("RAY_TPU_ENVS", "").split(",") if n.strip()] or environment_names()
    return [load_environment(name) for name in names]


def build_app(envs: list[Environment], outdir: str | Path | None = None):
    from cdktf import App  # heavy imports only once the configs are known to be good

    from infra.cdk.stacks import RayTpuStack

    app = App(outdir=str(outdir)) if outdir else App()
    for env in envs:
        RayTpuStack(app, env)
    return app


def main() -> int:
    try:
        envs = selected_environments()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for env in envs:
        for warning in env.warnings:
            print(f"warning: {env.name}: {warning}", file=sys.stderr)
    build_app(envs).synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
