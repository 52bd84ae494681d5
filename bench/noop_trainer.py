"""The start-up floor of Ray Train on a slice: a `JaxTrainer` whose train function does nothing but
note when it began, with `jobs.train`'s own ScalingConfig and RunConfig (jobs.train.fit.
ray_train_configs). bench/jobs_bench.py submits it through the Ray Jobs API exactly as it submits
`jobs.train`, as the second baseline of "submit -> every host in step 1".

    python bench/noop_trainer.py --generation v6e --topology 4x4 --out DIR

Prints `NOOP {"driver_started_at", "fit_started_at", "train_fn_at"}` (wall clock; train_fn_at: the
last worker's start).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

DRIVER_STARTED_AT = time.time()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def noop(config: dict) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    Path(config["out"], f"rank-{rank}.json").write_text(json.dumps({"at": time.time()}))


def main() -> int:
    from ray.train.v2.jax import JaxTrainer

    from jobs import cli
    from jobs.train.fit import ray_train_configs

    parser = cli.JobArgumentParser(prog="python bench/noop_trainer.py")
    cli.add_slice_flags(parser)
    parser.add_argument("--out", required=True)
    args, target = cli.parse(parser)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cli.connect_ray()
    run_name = f"noop-{int(time.time())}"
    scaling, run_config = ray_train_configs(target, run_name, str(out))
    trainer = JaxTrainer(noop, train_loop_config={"out": str(out)}, scaling_config=scaling, run_config=run_config)
    fit_started_at = time.time()
    trainer.fit()
    started = [json.loads(p.read_text())["at"] for p in out.glob("rank-*.json")]
    if len(started) != target.hosts:
        print(f"noop: {len(started)} of {target.hosts} workers ran", file=sys.stderr)
        return 1
    print(
        cli.result_line(
            "NOOP",
            {"run_name": run_name, "driver_started_at": DRIVER_STARTED_AT, "fit_started_at": fit_started_at, "train_fn_at": max(started)},
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
