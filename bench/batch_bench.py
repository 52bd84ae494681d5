"""Benchmark of batch inference (`make bench`, with .venv-serve's Python): `python -m jobs.batch` on this
machine (a local Ray, one CPU engine) against what a user would script instead, `vllm.LLM.generate`
over the same prompts and sampling settings in one process; and what a rerun after a kill costs.

    .venv-serve/bin/python bench/batch_bench.py [--prompts 1024] [--max-tokens 32] [--shard-rows 16] [--model-size tiny|small]

Both sides are timed whole, as a user waits for them: process start to the last completion written
(vLLM's engine start included on both; jobs.batch's also starts Ray and Ray Data). The tiny random
Llama jobs.serve makes (`--model-size small`: one of about 20M parameters, whose decoding steps are
compute as a real model's are, where the tiny one's are overhead), float32, eager, greedy.

Targets, each on a line ending in `met` or `NOT met`:
1. output tokens/s of jobs.batch against vllm.LLM.generate: >= 0.8x.
2. killed (SIGKILL, its whole process group) once half of its shards are committed, the rerun's own
   wall time against a full run's: <= 0.6x. A rerun starts its engines again, so the ratio has a
   floor that no job built on vLLM goes below: vLLM alone, stopped at half and run again over the
   rest, would take (its start-up + half its generation) / its whole run. Where the prompts are so
   few that this floor is above the target (vLLM's start-up being too large a part of a run), the
   rerun is printed for the record, not judged; `make bench` judges it over enough prompts to be batch work.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.verdict import verdict  # noqa: E402


def batch(model: Path, data: Path, out: Path, args: argparse.Namespace, kill_after_shards: int | None = None) -> dict:
    """One `python -m jobs.batch` run (a process group of its own); its wall time and summary, or
    (kill_after_shards) the time it was SIGKILLed at."""
    command = [sys.executable, "-m", "jobs.batch", "--model", str(model), "--data", str(data), "--output", str(out)]
    command += ["--max-tokens", str(args.max_tokens), "--shard-rows", str(args.shard_rows)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        if kill_after_shards is not None:
            before = engine_cores()
            while proc.poll() is None and len(list(out.glob("shard-*.parquet"))) < kill_after_shards:
                time.sleep(0.2)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            time.sleep(2)
            # vLLM's EngineCore has no watch on its parent: the killed run's engine outlives it (its Ray
            # worker and Ray are gone). Said, and stopped before the rerun is timed.
            outlived = engine_cores() - before
            for pid in outlived:
                os.kill(pid, signal.SIGKILL)
            return {"seconds": time.monotonic() - started, "committed": len(list(out.glob("shard-*.parquet"))), "outlived": len(outlived)}
        proc.wait(timeout=1800)
        log.seek(0)
        text = log.read()
    if proc.returncode != 0:
        raise RuntimeError(f"jobs.batch exited {proc.returncode}:\n{text[-3000:]}")
    summary = json.loads(next(line for line in text.splitlines() if line.startswith("BATCH ")).removeprefix("BATCH "))
    # Wall time, as a user waits (a rerun with nothing left to send has no pipeline time).
    return {**summary, "pipeline_s": summary.get("seconds", 0.0), "seconds": time.monotonic() - started}


def generate_alone(model: Path, work: Path, max_tokens: int, out: Path, env: dict[str, str] | None = None) -> float:
    """One greedy `vllm.LLM.generate` run over work/prompts.json (tests/jobs/batch/vllm_generate.py)
    into `out`; its wall time."""
    started = time.monotonic()
    command = [sys.executable, "tests/jobs/batch/vllm_generate.py", str(model), str(work / "prompts.json"), str(max_tokens), "0", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return time.monotonic() - started


def restart_floor(wall_s: float, generate_s: float) -> float:
    """The least rerun-over-full ratio of a vLLM run of `wall_s` whose generation took `generate_s`:
    its start-up again and half its generation, over the whole (pure)."""
    return (wall_s - generate_s / 2) / wall_s


def engine_cores() -> set[int]:
    """The pids of this machine's vLLM engine-core processes (vLLM names them VLLM::EngineCore)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(b"VLLM::EngineCore"):
                pids.add(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return pids


RERUN_TARGET = 0.6  # the rerun's own wall time over a full run's, at most
# Random Llamas by size (jobs.serve.tiny_model's shapes; head_dim 64, which vLLM's CPU attention takes).
MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": {},
    "small": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 8},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/batch_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--shard-rows", type=int, default=16)
    parser.add_argument(
        "--model-size",
        choices=sorted(MODEL_SIZES),
        default="tiny",
        help="tiny: serving's test model (a step is microseconds: start-up and per-row overhead dominate); "
        "small: a random Llama of about 20M parameters, whose steps are compute, as a real model's are",
    )
    args = parser.parse_args(argv)

    from jobs.serve.local import MODEL_DIR, apply_offline_environment, ensure_model
    from jobs.serve.tiny_model import TinyLlamaConfig, is_complete, make_tiny_model

    apply_offline_environment()
    if args.model_size == "tiny":
        model = ensure_model()
    else:
        model = MODEL_DIR.parent / f"{args.model_size}-llama"
        if not is_complete(model):
            make_tiny_model(model, cfg=TinyLlamaConfig(**MODEL_SIZES[args.model_size]))
    work = Path(tempfile.mkdtemp(prefix="batch-bench-"))
    texts = [f"Question {i}: the numbers after {i} are" for i in range(args.prompts)]
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt": t}) + "\n" for i, t in enumerate(texts)))
    (work / "prompts.json").write_text(json.dumps(texts))

    print(f"[bench] vllm.LLM.generate over {args.prompts} prompts, {args.max_tokens} tokens each", flush=True)
    base_s = generate_alone(model, work, args.max_tokens, work / "v.json")
    result = json.loads((work / "v.json").read_text())
    base_tokens = sum(r["completion_tokens"] for r in result["rows"])
    # For the record, not the target: vLLM with its engine core and worker in this one process (a
    # setting the user's script does not have by default; jobs.batch's engines keep the worker in
    # the engine core's process, jobs/batch/engine.py CPU_ENGINE_ENV).
    print("[bench] vllm.LLM.generate again, VLLM_ENABLE_V1_MULTIPROCESSING=0 (one process)", flush=True)
    one_process_s = generate_alone(model, work, args.max_tokens, work / "v1.json", {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    one_process = json.loads((work / "v1.json").read_text())
    floor = min(restart_floor(base_s, result["generate_s"]), restart_floor(one_process_s, one_process["generate_s"]))

    print("[bench] python -m jobs.batch, the same prompts", flush=True)
    full = batch(model, data, work / "full", args)
    shards = -(-args.prompts // args.shard_rows)
    print(f"[bench] python -m jobs.batch again, killed once {shards // 2} of {shards} shards are committed, then rerun", flush=True)
    killed = batch(model, data, work / "restart", args, kill_after_shards=shards // 2)
    rerun = batch(model, data, work / "restart", args)

    print()
    print(
        f"batch benchmark on this machine's CPU ({os.cpu_count()} cores): the {args.model_size} model, {args.prompts} prompts, "
        f"{args.max_tokens} tokens, greedy"
    )
    print(
        f"  vllm.LLM.generate: {base_tokens} tokens in {base_s:.1f} s (generate alone {result['generate_s']:.1f} s: "
        f"{base_tokens / result['generate_s']:.1f} tokens/s)"
    )
    print(
        f"  vllm.LLM.generate in one process (for the record): {base_tokens} tokens in {one_process_s:.1f} s "
        f"(generate alone {one_process['generate_s']:.1f} s)"
    )
    print(
        f"  the rerun's floor here: vLLM alone, stopped at half and run again over the rest, would take {floor:.2f}x of its "
        "whole run (its start-up again and half its generation; the lower of the two runs above)"
    )
    print(
        f"  jobs.batch: {full['output_tokens']} tokens in {full['seconds']:.1f} s (its pipeline, Ray's start excluded, "
        f"{full['pipeline_s']:.1f} s: {full['tokens_per_s']:.1f} tokens/s), {full['written']} shards"
    )
    print(
        f"  killed after {killed['seconds']:.1f} s with {killed['committed']} shards committed ({killed['outlived']} vLLM engine "
        "core(s) outlived the kill and were stopped before the rerun); the rerun sent "
        f"{rerun['requests']} prompts and wrote {rerun['written']} shards in {rerun['seconds']:.1f} s"
    )
    print(f"{'metric':58} {'ours':>8} {'baseline':>8} {'ratio':>8}  target  verdict")
    print(
        verdict(
            "output tokens/s, jobs.batch vs vllm.LLM.generate", full["output_tokens"] / full["seconds"], base_tokens / base_s, 0.8, False
        )
    )
    print(rerun_verdict(rerun["seconds"], full["seconds"], floor))
    return 0


def rerun_verdict(rerun_s: float, full_s: float, floor: float) -> str:
    """The rerun target's line (pure): judged where vLLM alone could meet it (`floor`, restart_floor),
    else the same numbers for the record, saying why they are not judged."""
    line = verdict("rerun after a kill at half, vs a full run (s)", rerun_s, full_s, RERUN_TARGET, True)
    if floor <= RERUN_TARGET:
        return line
    return line.rsplit("  ", 1)[0] + f"  for the record (not judged: the floor here is {floor:.2f}x)"


if __name__ == "__main__":
    sys.exit(main())
