"""The serve profile's own arithmetic, without vLLM or py-spy: processes get their roles from their
command lines, CPU is the difference of two snapshots summed by role, and py-spy's raw stacks are
counted by the innermost process's role and the leaf function."""

from __future__ import annotations

from bench.serve_profile import OTHER, cpu_by_role, hot_frames, role


def test_processes_get_their_roles_from_ray_and_vllm_process_titles():
    assert role("ray::ServeReplica:llm:LLMServer:tiny-llama") == "Serve LLM replica (vLLM's API + engine client)"
    assert role("ray::ServeReplica:llm:OpenAiIngress") == "Serve router replica (OpenAI ingress)"
    assert role("VLLM::EngineCore") == "vLLM engine core (scheduler)"
    assert role("VLLM::Worker") == "vLLM model worker (forward pass)"
    assert role("/usr/sbin/haproxy -f /tmp/ray/haproxy.cfg") == "HAProxy"
    assert role("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --node_id=x") == "raylet"
    assert role("python bench/vllm_cli.py serve /m --port 1") == "vllm serve API server"
    assert role("ray::IDLE") == OTHER


def test_cpu_is_what_each_role_spent_between_snapshots():
    before = {1: ("ray::ServeReplica:a", 10.0), 2: ("VLLM::EngineCore", 5.0), 3: ("raylet", 1.0)}
    after = {1: ("ray::ServeReplica:a", 12.5), 2: ("VLLM::EngineCore", 9.0), 3: ("raylet", 1.25), 4: ("raylet", 0.5)}
    spent = cpu_by_role(before, after)
    assert spent == {"Serve LLM replica (vLLM's API + engine client)": 2.5, "vLLM engine core (scheduler)": 4.0, "raylet": 0.75}


def test_py_spy_stacks_count_by_the_innermost_process_and_the_leaf_function():
    raw = [
        'process 10:"python serve_servers.py ray 1";process 11:"ray::ServeReplica:a";run (asyncio/base_events.py:1);'
        "_run_once (asyncio/base_events.py:1900) 7",
        'process 10:"python serve_servers.py ray 1";process 11:"ray::ServeReplica:a";_run_once (asyncio/base_events.py:1911) 3',
        'process 12:"VLLM::EngineCore";step (vllm/v1/engine/core.py:300) 5',
        "not a stack line",
    ]
    frames = hot_frames(raw)
    assert frames["Serve LLM replica (vLLM's API + engine client)"] == {"_run_once (asyncio/base_events.py)": 10}
    assert frames["vLLM engine core (scheduler)"] == {"step (vllm/v1/engine/core.py)": 5}
