"""The serve bench's own logic, without vLLM: the baseline's engine flags come from our LLMConfig, a
result with failed or short requests is refused, the targets print one line each ending in `met` or
`NOT met`, and bad arguments are one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import serve_bench
from bench.serve_load import Load, LoadError, check_result, client_command
from bench.serve_servers import RAY_DEFAULTS, engine_flags, our_engine_kwargs
from infra.serving import SERVE_FAST_PATH_ENV, cpu_llm_config_kwargs
from jobs.serve.local import CPU_SIMULATION_ENV, MAX_MODEL_LEN, MODEL_ID, local_ray_env

REPO = Path(__file__).resolve().parents[2]


def test_vllm_serve_gets_exactly_the_engine_kwargs_ray_serve_llm_gets(tmp_path):
    kwargs = cpu_llm_config_kwargs(tmp_path, model_id=MODEL_ID, max_model_len=MAX_MODEL_LEN)["engine_kwargs"]
    assert our_engine_kwargs(tmp_path) == kwargs  # the function jobs.serve.build_app deploys with
    flags = engine_flags(kwargs)
    assert flags == ["--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--enforce-eager"]
    # Every kwarg becomes a flag, whatever its type, so a new engine setting reaches both servers.
    assert engine_flags({"enable_prefix_caching": False, "max_num_seqs": 8, "kv_transfer_config": {"a": 1}}) == [
        "--no-enable-prefix-caching",
        *("--max-num-seqs", "8"),
        *("--kv-transfer-config", '{"a": 1}'),
    ]


def test_the_load_is_vllms_client_with_ignore_eos_and_the_asked_lengths(tmp_path):
    cmd = client_command("http://127.0.0.1:1", MODEL_ID, tmp_path, Load(4, 16, 32, 48), tmp_path / "r.json")
    assert cmd[1].endswith("bench/vllm_cli.py") and cmd[2:4] == ["bench", "serve"]
    text = " ".join(cmd)
    for part in ("--backend openai", "--dataset-name random", "--random-input-len 32", "--random-output-len 48", "--ignore-eos"):
        assert part in text
    assert "--max-concurrency 4" in text and "--num-prompts 16" in text and "--save-result" in text


def result(lens: list[int], completed: int | None = None, errors: list[str] | None = None) -> dict:
    return {
        "completed": len(lens) if completed is None else completed,
        "output_lens": lens,
        "total_output_tokens": sum(lens),
        "errors": errors or [],
    }


def test_a_result_with_every_token_asked_for_passes():
    check_result(result([64] * 8), Load(4, 8, 64, 64), "server")


def test_a_short_request_fails_the_result_naming_the_counts():
    with pytest.raises(LoadError, match=r"server returned fewer tokens than asked at concurrency 4: 505 tokens for 8 requests of 64"):
        check_result(result([64] * 7 + [57]), Load(4, 8, 64, 64), "server")


def test_failed_requests_fail_the_result_with_the_first_error():
    with pytest.raises(LoadError, match=r"2 of 8 requests failed at concurrency 4; the first error: boom"):
        check_result(result([64] * 6 + [0, 0], completed=6, errors=["", "boom"]), Load(4, 8, 64, 64), "server")


def run(tput: float, ttft: float) -> dict:
    return {
        "output_throughput": tput,
        "median_ttft_ms": ttft,
        "p95_ttft_ms": ttft,
        "median_itl_ms": 1.0,
        "p95_itl_ms": 2.0,
        "median_tpot_ms": 1.0,
    }


def test_targets_use_the_median_of_per_repeat_ratios_and_end_in_met_or_not_met():
    vllm, ray = serve_bench.VLLM, serve_bench.RAY
    runs = {
        vllm: {1: [run(100, 30), run(50, 40), run(100, 30)], 8: [run(400, 100)] * 3},
        ray: {1: [run(90, 50), run(45, 95), run(70, 60)], 8: [run(300, 200)] * 3},
    }
    summary = serve_bench.summarize(runs, [vllm, ray], [1, 8])
    lines = serve_bench.targets(summary)
    assert [ok for _, ok in lines] == [True, True, False, False]
    assert "concurrency 1" in lines[0][0] and "0.90x median of 3 repeats (0.70-0.90x)" in lines[0][0]
    assert "+30 ms median (+20 to +55 ms)" in lines[1][0]  # per-repeat differences 20, 55, 30
    assert "0.75x" in lines[2][0] and "+100 ms" in lines[3][0]
    printed = [serve_bench.target_line(text, ok) for text, ok in lines]
    assert [line.rsplit(": ", 1)[1] for line in printed] == ["met", "met", "NOT met", "NOT met"]


def test_ray_defaults_turns_back_every_setting_we_change():
    assert set(RAY_DEFAULTS) >= set(local_ray_env()) == set(SERVE_FAST_PATH_ENV) | set(CPU_SIMULATION_ENV)
    assert serve_bench.variant("ray-defaults") == ("ray-defaults", RAY_DEFAULTS)
    assert serve_bench.variant("nice15:RAY_worker_niceness=15") == ("nice15", {"RAY_worker_niceness": "15"})


@pytest.mark.parametrize(
    "args, message",
    [
        (["--concurrencies", "1,x"], "is not a comma-separated list of positive integers"),
        (["--concurrencies", "0"], "is not a comma-separated list of positive integers"),
        (["--variant", "oops"], "is neither NAME:KEY=VALUE"),
        (["--variant", "py:RAY_SERVE_ENABLE_HA_PROXY=0"], "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1 needs RAY_SERVE_ENABLE_HA_PROXY=1"),
        (["--input-len", "500", "--output-len", "64"], "--input-len + --output-len must be between 2 and the max model length, 512"),
        (["--repeats", "0"], "--repeats: invalid choice"),
    ],
)
def test_bad_arguments_are_one_line_errors(args, message):
    proc = subprocess.run([sys.executable, "bench/serve_bench.py", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
