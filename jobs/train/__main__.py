"""`python -m jobs.train`: see `jobs.train`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from jobs import cli
from jobs.train.config import AlreadyTrained, as_json, parse_config
from jobs.train.fit import run_training


def main(argv: Sequence[str] | None = None) -> int:
    target, config, name, storage, budget = parse_config(argv)
    print(f"train: {name} on {target.describe()}, {config.steps} steps, checkpoints in {storage}", flush=True)
    cli.connect_ray()
    try:
        report = run_training(target, config, name, storage, budget, log=lambda line: print(line, flush=True))
    except AlreadyTrained as err:
        print(f"train: {err}", flush=True)
        return 0
    failed = cli.finish(report, "train", "TRAIN", lambda result: result.summary(), as_json)
    return failed if failed is not None else 0


if __name__ == "__main__":
    sys.exit(main())
