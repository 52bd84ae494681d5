"""What a user would script instead of jobs.batch: `vllm.LLM.generate` over a list of prompts in one
process, with the engine settings jobs.batch gives a CPU engine. Run with .venv-serve's Python:

    python tests/jobs/batch/vllm_generate.py MODEL PROMPTS.json MAX_TOKENS TEMPERATURE OUT.json

Writes [{completion, completion_tokens, finish_reason}] in the prompts' order, and the wall time."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))


def main() -> None:
    model, prompts_path, max_tokens, temperature, out = sys.argv[1:6]
    from jobs.serve.local import apply_offline_environment

    apply_offline_environment()
    started = time.monotonic()
    from vllm import LLM, SamplingParams

    prompts = json.loads(Path(prompts_path).read_text())
    llm = LLM(model=model, max_model_len=512, dtype="float32", enforce_eager=True)
    loaded = time.monotonic()
    outputs = llm.generate(prompts, SamplingParams(temperature=float(temperature), max_tokens=int(max_tokens)))
    done = time.monotonic()
    rows = [
        {"completion": o.outputs[0].text, "completion_tokens": len(o.outputs[0].token_ids), "finish_reason": o.outputs[0].finish_reason}
        for o in outputs
    ]
    Path(out).write_text(json.dumps({"rows": rows, "seconds": done - started, "generate_s": done - loaded}))


if __name__ == "__main__":
    main()
