"""jobs.batch's rules without Ray or vLLM: the shards and their commit, reading prompts, the engine
layout, vLLM's finish_reason, and every bad input refused in one line (exit 2) before anything
starts or is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infra import catalog
from infra.config import load_environment
from jobs.batch import engine, shards
from jobs.batch.prompts import BatchInputError, read_prompts

REPO = Path(__file__).resolve().parents[3]
KEY = shards.RunKey("/data/p.jsonl", 5, 2, "/models/tiny", 8, 0.0)


def columns(rows: range) -> dict[str, list]:
    return {
        "id": [f"q{i}" for i in rows],
        "prompt": [f"p{i}" for i in rows],
        "completion": ["x"] * len(rows),
        "prompt_tokens": [3] * len(rows),
        "completion_tokens": [8] * len(rows),
        "finish_reason": ["length"] * len(rows),
    }


def test_shards_cover_every_row_once_the_last_one_shorter():
    assert shards.plan(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert shards.plan(4, 4) == [range(0, 4)]
    assert [i for r in shards.plan(1000, 7) for i in r] == list(range(1000))


def test_a_committed_shard_is_whole_under_its_name_and_counted_by_a_rerun_of_the_same_run(tmp_path):
    out = str(tmp_path / "out")
    assert shards.committed(out, KEY) == set()  # a new directory
    shards.write_shard(out, 1, columns(range(2, 4)), KEY)
    assert sorted(p.name for p in Path(out).iterdir()) == ["shard-000001.parquet"]  # no temporary left
    table = pq.read_table(Path(out, "shard-000001.parquet"))
    assert table.column_names == list(shards.COLUMNS) and table.column("id").to_pylist() == ["q2", "q3"]
    assert shards.committed(out, KEY) == {1}


def test_a_partial_file_of_a_killed_write_is_ignored_then_cleared(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".shard-000000.parquet.tmp").write_bytes(b"half a parquet file")
    assert shards.committed(str(out), KEY) == set()
    shards.clear_leftovers(str(out))
    assert list(out.iterdir()) == []


def test_an_output_of_another_run_or_with_other_files_is_refused_naming_why(tmp_path):
    out = str(tmp_path / "out")
    shards.write_shard(out, 0, columns(range(0, 2)), KEY)
    other = shards.RunKey("/data/p.jsonl", 5, 2, "/models/tiny", 16, 0.0)
    with pytest.raises(shards.OutputError, match="holds shards of another run \\(its max_tokens differ\\)"):
        shards.committed(out, other)
    Path(out, "notes.txt").write_text("mine")
    with pytest.raises(shards.OutputError, match="holds other files \\(notes.txt\\)"):
        shards.committed(out, KEY)
    a_file = tmp_path / "f.parquet"
    a_file.write_bytes(b"x")
    with pytest.raises(shards.OutputError, match="is a file"):
        shards.committed(str(a_file), KEY)


def test_prompts_from_gcs_and_shards_committed_to_gcs_as_locally(gcs):
    """gs:// in and out through the real gcsfs and pyarrow clients (the emulated GCS): the prompts of
    a directory of JSON lines and one of parquet, a shard uploaded whole under its name and counted by a rerun, an
    output holding anything else refused."""
    from jobs.runtime import storage

    storage.write_bytes(f"{gcs}/in/a.jsonl", b'{"id": "x", "prompt": "one"}\n')
    storage.write_bytes(f"{gcs}/in/b.jsonl", b'{"id": "y", "prompt": "two"}\n')
    got = read_prompts(f"{gcs}/in", "prompt")
    assert (got.ids, got.texts) == (("x", "y"), ("one", "two"))
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": [7], "question": ["three"]}), sink)
    storage.write_bytes(f"{gcs}/pq/part-0.parquet", sink.getvalue().to_pybytes())
    got = read_prompts(f"{gcs}/pq", "question")
    assert (got.ids, got.texts, got.source) == ((7,), ("three",), "parquet")
    out = f"{gcs}/out"
    assert shards.committed(out, KEY) == set()
    shards.write_shard(out, 2, columns(range(4, 5)), KEY)
    assert [f.rsplit("/", 1)[-1] for f in storage.list_files(out)] == ["shard-000002.parquet"]
    assert pq.read_table(storage.filesystem(out)[1] + "/shard-000002.parquet", filesystem=storage.filesystem(out)[0]).num_rows == 1
    assert shards.committed(out, KEY) == {2}
    storage.write_bytes(f"{out}/README", b"mine")
    with pytest.raises(shards.OutputError, match="holds other files \\(README\\)"):
        shards.committed(out, KEY)


def test_prompts_keep_the_inputs_ids_as_given_and_use_the_index_where_there_are_none(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps({"id": i * 10, "prompt": f"p{i}"}) for i in range(3)) + "\n")
    got = read_prompts(str(jsonl), "prompt")
    assert (got.ids, got.texts, got.source) == ((0, 10, 20), ("p0", "p1", "p2"), "json")
    pq.write_table(pa.table({"question": ["a", "b"]}), tmp_path / "q.parquet")
    got = read_prompts(str(tmp_path / "q.parquet"), "question")
    assert (got.ids, got.texts) == ((0, 1), ("a", "b"))
    text = tmp_path / "lines.txt"
    text.write_text("first\n\nsecond\n")
    assert read_prompts(str(text), "ignored").texts == ("first", "second")


def test_bad_prompts_are_one_line_naming_the_flag(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"text": "no prompt field"}\n')
    with pytest.raises(BatchInputError, match="^argument --prompt-field: p.jsonl line 1 has no 'prompt' field$"):
        read_prompts(str(jsonl), "prompt")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(BatchInputError, match="holds no prompts"):
        read_prompts(str(empty), "prompt")
    pq.write_table(pa.table({"prompt": [1, 2]}), tmp_path / "n.parquet")
    with pytest.raises(BatchInputError, match="'prompt' is int, not text"):
        read_prompts(str(tmp_path / "n.parquet"), "prompt")


def test_one_engine_per_host_tensor_parallel_over_its_chips_cpu_on_the_simulation():
    shape = catalog.shape("v6e", "4x4")
    tpu = engine.layout(shape, 2, on_cpu=False, max_model_len=2048)
    assert tpu.engines == 8 and tpu.bundle == {"CPU": 1.0, "TPU": 4.0}
    # Each engine schedules as the offline vllm.LLM does on its platform (vLLM 0.29.0
    # EngineArgs.get_batch_defaults, UsageContext.LLM_CLASS): v6e 256 sequences / 2048 tokens, CPU
    # 256 / 4096, a chip it does not name (v4) its other-hardware row, 256 / 8192.
    assert tpu.engine_kwargs == {
        "max_model_len": 2048,
        "tensor_parallel_size": 4,
        "distributed_executor_backend": "uni",
        "max_num_seqs": 256,
        "max_num_batched_tokens": 2048,
    }
    v4 = engine.layout(catalog.shape("v4", "2x2x2"), 1, on_cpu=False, max_model_len=512)
    assert (v4.engines, v4.engine_kwargs["max_num_seqs"], v4.engine_kwargs["max_num_batched_tokens"]) == (2, 256, 8192)
    assert tpu.env_vars == {}
    sim = engine.layout(shape, 1, on_cpu=True, max_model_len=512, machine_cores=16)
    # A CPU engine's worker runs in its EngineCore process: vLLM 0.29.0 keeps the "uni" executor on
    # CPU only with VLLM_ENABLE_V1_MULTIPROCESSING=0 (vllm/platforms/cpu.py), else it adds a process.
    assert sim.engines == 4 and sim.engine_kwargs == {
        "max_model_len": 512,
        "dtype": "float32",
        "enforce_eager": True,
        "distributed_executor_backend": "uni",
        "max_num_seqs": 256,
        "max_num_batched_tokens": 4096,
    }
    # ... and its torch threads are the machine's cores shared out among its engines (Ray would give
    # an actor of one CPU one thread).
    assert sim.env_vars == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "4"}
    local = engine.layout(None, 1, on_cpu=True, max_model_len=512, machine_cores=2)
    assert local.engines == 1 and local.bundle == {"CPU": 1}
    assert local.env_vars == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "2"}
    assert engine.layout(shape, 2, on_cpu=True, max_model_len=512, machine_cores=2).env_vars["OMP_NUM_THREADS"] == "1"


def test_prompts_go_to_the_engines_a_batch_per_block_and_every_engine_gets_one():
    # One block per engine batch (64 rows), not Ray Data's 200 blocks at least: 1024 prompts, 16.
    assert engine.input_blocks(1024, 1) == 16
    assert engine.input_blocks(1000, 1) == 16  # the last block shorter
    # Few prompts over many engines: a block per engine while there are rows for them.
    assert engine.input_blocks(100, 8) == 8
    assert engine.input_blocks(3, 8) == 3
    assert engine.input_blocks(1, 1) == 1


def test_finish_reason_is_stop_on_an_eos_id_and_length_otherwise(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    eos = engine.eos_ids(str(tmp_path))
    assert eos == {2, 7}
    assert engine.finish_reason([5, 6, 7], eos) == "stop"
    assert engine.finish_reason([5, 6, 9], eos) == "length"
    assert engine.finish_reason([], eos) == "length"


def run_batch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.batch", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def llama_dir(tmp_path: Path, model_type: str = "llama") -> Path:
    model = tmp_path / f"{model_type}-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["X"]}))
    return model


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("missing-field", "argument --prompt-field: p.jsonl line 1 has no 'prompt' field"),
        ("empty", "argument --data: "),
        ("not-llama", "argument --model: "),
        ("output-holds-else", "argument --output: "),
    ],
)
def test_each_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, case, needle):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hello"}\n')
    model = llama_dir(tmp_path)
    out = tmp_path / "out"
    if case == "missing-field":
        data.write_text('{"question": "hello"}\n')
    elif case == "empty":
        data.write_text("")
    elif case == "not-llama":
        model = llama_dir(tmp_path, "gpt2")
    else:
        out.mkdir()
        (out / "results.csv").write_text("a,b\n")
    before = sorted(p.name for p in out.iterdir()) if out.exists() else None
    proc = run_batch("--model", str(model), "--data", str(data), "--output", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert (sorted(p.name for p in out.iterdir()) if out.exists() else None) == before  # nothing written


def test_a_gs_model_is_read_through_the_bucket_mount_and_refused_in_one_line_where_there_is_none(gcs, tmp_path, monkeypatch):
    """The engines read a gs:// model through the bucket's FUSE mount (the batch RayJob's pods have it,
    above): with no mount here the job says so in one line, exit 2, before Ray starts; with the
    mount (RAY_TPU_GKE_BUCKET_MOUNT, as on a pod) the engines get the mounted directory."""
    from jobs.batch.__main__ import engine_model_path, mount_problem
    from jobs.runtime import storage

    model = f"{gcs}/models/tiny"
    storage.write_bytes(f"{model}/config.json", json.dumps({"model_type": "llama"}).encode())
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hello"}\n')
    out = tmp_path / "out"
    proc = run_batch("--model", model, "--data", str(data), "--output", str(out))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "argument --model: the engines read gs://" in line and "mounted at /gcs" in line and "--rayjob" in line, line
    assert not out.exists()
    mount = tmp_path / "mount"
    _, _, path = model.removeprefix("gs://").partition("/")
    (mount / path).mkdir(parents=True)
    monkeypatch.setenv("RAY_TPU_GKE_BUCKET_MOUNT", str(mount))
    assert (engine_model_path(model), mount_problem(model)) == (f"{mount}/{path}", None)


SERVE_IMAGE = "us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-serve-tpu@sha256:" + "cd" * 32
TPU_IMAGE = "us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-tpu@sha256:" + "ab" * 32
CRDS = REPO.parent / "shared" / "kuberay" / "crds"


def print_batch_rayjob(*flags: str) -> subprocess.CompletedProcess:
    args = ["batch", "--env", "prod", "--tpu-image", TPU_IMAGE, "--print-rayjob", "--name", "b-run", *flags]
    args += ["--", "--model", "/models/tiny", "--data", "/data/p.jsonl", "--output", "/out"]
    return subprocess.run([sys.executable, "-m", "jobs.submit", *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_a_batch_rayjob_runs_the_serving_image_everywhere_and_validates_strictly():
    import yaml

    from tests.kuberay_schema import errors

    proc = print_batch_rayjob("--serve-image", SERVE_IMAGE)
    assert proc.returncode == 0, proc.stderr
    rayjob = next(d for d in yaml.safe_load_all(proc.stdout) if d["kind"] == "RayJob")
    spec = rayjob["spec"]
    assert spec["entrypoint"].startswith("python -m jobs.batch --env prod ") and "--output /out" in spec["entrypoint"]
    images = [spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]]
    images += [g["template"]["spec"]["containers"][0]["image"] for g in spec["rayClusterSpec"]["workerGroupSpecs"]]
    images.append(spec["submitterPodTemplate"]["spec"]["containers"][0]["image"])
    assert images == [SERVE_IMAGE] * len(images)
    assert "runtimeEnvYAML" not in spec or "pip" not in spec["runtimeEnvYAML"]  # vLLM is in the image: no pip
    # The head (the driver checks the model there) and the workers (the engines read it) mount the
    # environment's bucket at /gcs with the GCS FUSE CSI driver, as the RayService's pods do.
    bucket = load_environment("prod").bucket_name
    for group in [spec["rayClusterSpec"]["headGroupSpec"], *spec["rayClusterSpec"]["workerGroupSpecs"]]:
        template = group["template"]
        assert template["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        (container,) = template["spec"]["containers"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert volumes[mounts["/gcs"]]["csi"]["driver"] == "gcsfuse.csi.storage.gke.io"
        assert volumes[mounts["/gcs"]]["csi"]["volumeAttributes"]["bucketName"] == bucket
        assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}
    submitter = spec["submitterPodTemplate"]["spec"]
    assert "volumes" not in submitter and "volumeMounts" not in submitter["containers"][0]  # it only submits
    if not CRDS.is_dir():
        pytest.skip("../shared/kuberay/crds is not here")
    assert errors(CRDS, rayjob) == []


def test_a_batch_rayjob_without_a_serving_image_or_with_another_is_refused_in_one_line():
    for flags, needle in (
        ((), "error: --serve-image: a batch RayJob runs vLLM"),
        (("--serve-image", TPU_IMAGE), "is not it: pass --serve-image <registry>/ray-tpu-gke/ray-serve-tpu"),
    ):
        proc = print_batch_rayjob(*flags)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr
        assert proc.stdout == ""


def test_rows_come_back_in_any_order_and_twice_yet_each_shard_is_committed_once_whole(tmp_path):
    """Ray Data retries a lost engine's blocks on the engines left: a row may come back twice, even
    after its shard was committed. The collector commits a shard once all its rows are in, and
    counts each row once."""
    from jobs.batch.__main__ import Collector
    from jobs.batch.prompts import Prompts

    prompts = Prompts(tuple(f"q{i}" for i in range(5)), tuple(f"p{i}" for i in range(5)), "json")
    out = tmp_path / "out"
    c = Collector(prompts, shards.plan(5, 2), {0, 1, 2}, str(out), KEY)

    def row(i: int) -> dict:
        return {"_row": i, "completion": f"c{i}", "prompt_tokens": 2, "completion_tokens": 3, "finish_reason": "length"}

    for i in (4, 1, 0, 1, 3, 0, 2, 4):
        c.add(row(i))
    assert (c.committed, c.done_rows, c.tokens) == (3, 5, 15)
    assert sorted(p.name for p in out.iterdir()) == [shards.shard_name(i) for i in range(3)]
    got = [r for i in range(3) for r in pq.read_table(out / shards.shard_name(i)).to_pylist()]
    assert [(r["id"], r["completion"]) for r in got] == [(f"q{i}", f"c{i}") for i in range(5)]


def test_the_driver_builds_ray_datas_processor_without_importing_vllm():
    """The driver never runs an engine: Ray 2.60's vLLM stage imports vLLM only to name its fatal
    errors, under try/except ImportError (ray/llm/_internal/common/errors.py), so jobs.batch imports
    it with vLLM blocked and unblocks it after; an engine's process imports vLLM as before."""
    serve_python = REPO / ".venv-serve" / "bin" / "python"
    if not (REPO / ".venv-serve" / ".installed").is_file():
        pytest.skip(".venv-serve is not installed: run scripts/setup_serve_env.sh (make serve-setup)")
    probe = (
        "import sys\n"
        "from jobs.batch import engine\n"
        "engine.import_processor()\n"
        "from ray.llm._internal.common import errors\n"
        "from ray.llm._internal.batch.stages import vLLMEngineStage\n"
        "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')), errors.VLLM_FATAL_ERRORS)\n"
    )
    out = subprocess.run([str(serve_python), "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # Nothing imported and nothing left blocked (a None entry would be listed as 'vllm'): the
    # process can still import vLLM, as the engines' processes do.
    assert out.stdout.strip().splitlines()[-1] == "[] ()"
