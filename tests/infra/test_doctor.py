"""The drift check: `compare` on GKE's own message types, and the CLI end to end through the real
`ClusterManagerClient` (REST) against a local HTTP server that answers the GKE v1 paths."""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from google.cloud import container_v1

from infra import kuberay_crd
from infra.config import environment_names, load_environment, parse_environment
from infra.doctor import DoctorError, Finding, bounded, compare, main, ray_shapes
from tests.fake_kube import FakeKube, serve
from tests.infra.fake_gke import FakeGke, google_error, render_cluster, render_node_pools

REPO = Path(__file__).resolve().parents[2]
DEV = load_environment("dev")
PROD = load_environment("prod")


def as_protos(cluster: dict, pools: list[dict]) -> tuple[container_v1.Cluster, list[container_v1.NodePool]]:
    """JSON in the API's shape -> the types the client returns (the same parser the REST transport uses)."""
    parse = lambda cls, d: cls.from_json(json.dumps(d), ignore_unknown_fields=True)  # noqa: E731
    return parse(container_v1.Cluster, cluster), [parse(container_v1.NodePool, p) for p in pools]


def drift(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if not f.ok]


def by_name(pools: list[dict], name: str) -> dict:
    return next(p for p in pools if p["name"] == name)


# --- compare (pure) --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", environment_names())
def test_a_correct_deploy_has_no_drift(name):
    env = load_environment(name)
    findings = compare(env, *as_protos(render_cluster(env), render_node_pools(env)))
    assert findings and drift(findings) == []
    subjects = {f.subject for f in findings}
    if env.mode == "standard":
        assert {"pool cpu", *(f"pool {p['name']}" for p in render_node_pools(env))} <= subjects
    else:
        assert subjects == {f"cluster {env.cluster_name}"}


def test_the_rendered_pool_is_the_documented_shape():
    # Pins the fake to GKE's JSON, so the renderer cannot drift along with `compare`.
    assert by_name(render_node_pools(DEV), "v6e-4x4-0") | {"config": None, "selfLink": None} == {
        "name": "v6e-4x4-0",
        "config": None,
        "initialNodeCount": 0,
        "locations": ["us-east5-b"],
        "selfLink": None,
        "version": "1.34.1-gke.1829001",
        "status": "RUNNING",
        "management": {"autoUpgrade": True, "autoRepair": True},
        "placementPolicy": {"type": "COMPACT", "tpuTopology": "4x4"},
        "autoscaling": {"enabled": True, "minNodeCount": 0, "maxNodeCount": 4, "locationPolicy": "ANY"},
    }
    assert by_name(render_node_pools(DEV), "v6e-4x4-0")["config"]["machineType"] == "ct6e-standard-4t"


def test_drifted_topology_names_the_pool_and_both_topologies():
    pools = render_node_pools(DEV)
    by_name(pools, "v6e-4x4-0")["placementPolicy"]["tpuTopology"] = "4x8"
    assert drift(compare(DEV, *as_protos(render_cluster(DEV), pools))) == [Finding("pool v6e-4x4-0", "tpu topology", "4x4", "4x8", False)]


def test_missing_and_extra_pools_are_drift_default_pool_included():
    pools = [p for p in render_node_pools(DEV) if p["name"] != "v6e-4x4-0"]
    pools += [{**by_name(pools, "cpu"), "name": "default-pool"}, {**by_name(pools, "cpu"), "name": "old-v5e"}]
    assert drift(compare(DEV, *as_protos(render_cluster(DEV), pools))) == [
        Finding("pool v6e-4x4-0", "exists", "present", "missing", False),
        Finding("pool default-pool", "exists", "absent", "present", False),
        Finding("pool old-v5e", "exists", "absent", "present", False),
    ]


def test_missing_cpu_pool_is_drift():
    pools = [p for p in render_node_pools(DEV) if p["name"] != "cpu"]
    assert [(f.subject, f.field) for f in drift(compare(DEV, *as_protos(render_cluster(DEV), pools)))] == [("pool cpu", "exists")]


@pytest.mark.parametrize(
    "path, field",
    [
        (("enabled",), "ray operator add-on"),
        (("rayClusterLoggingConfig", "enabled"), "ray cluster logging"),
        (("rayClusterMonitoringConfig", "enabled"), "ray cluster monitoring"),
    ],
)
def test_ray_operator_addon_settings(path, field):
    cluster = render_cluster(DEV)
    target = cluster["addonsConfig"]["rayOperatorConfig"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = False
    assert drift(compare(DEV, *as_protos(cluster, render_node_pools(DEV)))) == [
        Finding("cluster ray-tpu-dev", field, "enabled", "disabled", False)
    ]


def test_missing_addons_config_reads_as_disabled():
    cluster = render_cluster(DEV)
    del cluster["addonsConfig"]
    assert {f.field for f in drift(compare(DEV, *as_protos(cluster, render_node_pools(DEV))))} == {
        "ray operator add-on",
        "ray cluster logging",
        "ray cluster monitoring",
    }


def test_prod_pool_drift_machine_type_size_capacity_status_and_policy():
    pools = render_node_pools(PROD)
    spot = by_name(pools, "v6e-multislice-1")
    spot["config"]["machineType"] = "ct6e-standard-8t"
    spot["config"].pop("spot")  # on-demand where spot was asked for
    spot["status"] = "RUNNING_WITH_ERROR"
    ironwood = by_name(pools, "ironwood-0")
    ironwood["placementPolicy"].pop("policyName")
    ironwood["initialNodeCount"] = 1
    ironwood["config"]["reservationAffinity"]["values"] = ["other-res"]
    v5e = by_name(pools, "v5e-serving")
    v5e["autoscaling"]["maxNodeCount"] = 5
    v5e["locations"] = ["us-central1-b"]  # the group's zone is us-central1-a
    v5e["config"]["spot"] = True
    assert drift(compare(PROD, *as_protos(render_cluster(PROD), pools))) == [
        Finding("pool v6e-multislice-1", "machine type", "ct6e-standard-4t", "ct6e-standard-8t", False),
        Finding("pool v6e-multislice-1", "capacity", "spot", "on-demand", False),
        Finding("pool v6e-multislice-1", "status", "RUNNING", "RUNNING_WITH_ERROR", False),
        Finding("pool ironwood-0", "workload policy", "set", "(none)", False),
        Finding("pool ironwood-0", "size", "fixed 2 nodes", "fixed 1 nodes", False),
        Finding("pool ironwood-0", "capacity", "reservation ironwood-res", "reservation other-res", False),
        Finding("pool v5e-serving", "zone", "us-central1-a", "us-central1-b", False),
        Finding("pool v5e-serving", "size", "autoscaled 0-2 nodes", "autoscaled 0-5 nodes", False),
        Finding("pool v5e-serving", "capacity", "on-demand", "spot", False),
    ]


def test_autoscaling_switched_on_or_off_is_drift():
    pools = render_node_pools(PROD)
    by_name(pools, "ironwood-0")["autoscaling"] = {"enabled": True, "minNodeCount": 0, "maxNodeCount": 2}
    del by_name(pools, "v6e-multislice-0")["autoscaling"]
    by_name(pools, "v6e-multislice-0")["initialNodeCount"] = 4
    assert drift(compare(PROD, *as_protos(render_cluster(PROD), pools))) == [
        Finding("pool v6e-multislice-0", "size", "autoscaled 0-4 nodes", "fixed 4 nodes", False),
        Finding("pool ironwood-0", "size", "fixed 2 nodes", "autoscaled 0-2 nodes", False),
    ]


def test_flex_start_and_fixed_multihost_slices():
    env = parse_environment(
        {
            "name": "qp",
            "project": "my-gcp-project",
            "region": "us-east5",
            "zone": "us-east5-a",
            "cluster_name": "qp",
            "gke_min_version": "1.35",
            "slice_groups": [
                {"name": "flex", "generation": "v5p", "topology": "2x2x4", "capacity": "flex-start"},
                {"name": "fixed", "generation": "v6e", "topology": "4x8", "slices": 2, "capacity": "spot"},
            ],
        }
    )
    pools = render_node_pools(env)
    assert {p["name"] for p in pools} == {"cpu", "flex-0", "fixed-0", "fixed-1"}
    assert drift(compare(env, *as_protos(render_cluster(env), pools))) == []
    flex = by_name(pools, "flex-0")
    del flex["config"]["flexStart"]
    flex["management"]["autoRepair"] = True  # flex-start pools must not auto-repair
    by_name(pools, "fixed-1")["initialNodeCount"] = 7
    assert drift(compare(env, *as_protos(render_cluster(env), pools))) == [
        Finding("pool flex-0", "auto repair", "off", "on", False),
        Finding("pool flex-0", "capacity", "flex-start", "on-demand", False),
        Finding("pool fixed-1", "size", "fixed 8 nodes", "fixed 7 nodes", False),
    ]


def test_autopilot_compares_the_cluster_only():
    env = load_environment("autopilot")
    cluster = render_cluster(env)
    cluster["autopilot"]["enabled"] = False
    stray = render_node_pools(DEV)  # pools are GKE's business on Autopilot: ignored
    assert drift(compare(env, *as_protos(cluster, stray))) == [Finding("cluster ray-tpu-autopilot", "mode", "autopilot", "standard", False)]


# --- the CLI against a local GKE -------------------------------------------------------------------


@pytest.fixture
def gke():
    fake = FakeGke().start().serve(DEV)
    try:
        yield fake
    finally:
        fake.stop()


def run(capsys, gke: FakeGke, *extra: str, env: str = "dev") -> tuple[int, str, str]:
    code = main(["--env", env, "--endpoint", gke.url, "--timeout", "5", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_matching_cluster_exits_0(capsys, gke):
    code, out, err = run(capsys, gke)
    assert (code, err) == (0, "")
    assert "DRIFT" not in out and "dev: all 20 checks match the config" in out
    name = "projects/my-gcp-project/locations/us-east5-b/clusters/ray-tpu-dev"
    assert [r.split("?")[0] for r in gke.requests] == [f"/v1/{name}", f"/v1/{name}/nodePools"]


def test_cli_drifted_topology_exits_1(capsys, gke):
    gke.pool("v6e-4x4-0")["placementPolicy"]["tpuTopology"] = "4x8"
    code, out, err = run(capsys, gke)
    assert (code, err) == (1, "")
    row = next(line for line in out.splitlines() if "DRIFT" in line)
    assert "pool v6e-4x4-0" in row and "tpu topology" in row and "4x4" in row and "4x8" in row
    assert "1 of 20 checks drifted: pool v6e-4x4-0 tpu topology" in out


def test_cli_missing_pool_exits_1(capsys, gke):
    gke.node_pools.remove(gke.pool("v6e-4x4-0"))
    code, out, _ = run(capsys, gke)
    assert code == 1 and "pool v6e-4x4-0 exists" in out


def test_cli_extra_pool_exits_1(capsys, gke):
    gke.node_pools.append({**gke.pool("cpu"), "name": "default-pool"})
    code, out, _ = run(capsys, gke)
    assert code == 1 and "pool default-pool exists" in out


def test_cli_addon_disabled_exits_1(capsys, gke):
    gke.cluster["addonsConfig"]["rayOperatorConfig"] = {"enabled": False}
    code, out, _ = run(capsys, gke)
    assert code == 1 and "3 of 20 checks drifted: cluster ray-tpu-dev ray operator add-on" in out


def test_cli_autopilot_reads_no_pools(capsys, gke):
    gke.serve(load_environment("autopilot"))
    code, out, _ = run(capsys, gke, env="autopilot")
    assert code == 0 and [r.split("?")[0] for r in gke.requests] == [
        "/v1/projects/my-gcp-project/locations/us-east5/clusters/ray-tpu-autopilot"
    ]


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    "kind, status, body, says",
    [
        (
            "cluster",
            403,
            google_error(
                403,
                "PERMISSION_DENIED",
                'Required "container.clusters.get" permission(s) for "projects/my-gcp-project/locations/us-east5-b/clusters/ray-tpu-dev".',
                "IAM_PERMISSION_DENIED",
            ),
            [
                "reading cluster projects/my-gcp-project/locations/us-east5-b/clusters/ray-tpu-dev",
                "403",
                'Required "container.clusters.get"',
                "gcloud auth application-default login",
            ],
        ),
        (
            "cluster",
            404,
            google_error(404, "NOT_FOUND", "Not found: projects/my-gcp-project/locations/us-east5-b/clusters/ray-tpu-dev."),
            ["not found", "make deploy ENV=dev"],
        ),
        (
            "nodePools",
            503,
            google_error(503, "UNAVAILABLE", "The service is currently unavailable."),
            ["listing the node pools of", "unavailable", "try again"],
        ),
        ("nodePools", 500, google_error(500, "INTERNAL", "Internal error encountered."), ["500 Internal error encountered"]),
    ],
)
def test_cli_api_error_exits_2_with_one_line(capsys, gke, kind, status, body, says):
    gke.errors[kind] = (status, body)
    code, out, err = run(capsys, gke)
    line = one_line_error(err)
    assert code == 2 and out == ""
    for text in says:
        assert text in line
    assert len(gke.requests) == (1 if kind == "cluster" else 2)  # no retries


def test_cli_timeout_exits_2_promptly(capsys, gke):
    gke.delays["cluster"] = 3.0
    start = time.monotonic()
    code = main(["--env", "dev", "--endpoint", gke.url, "--timeout", "0.5"])
    elapsed = time.monotonic() - start
    line = one_line_error(capsys.readouterr().err)
    assert code == 2 and elapsed < 2.0 and "no answer within 0.5 s" in line and "--timeout" in line


def test_cli_unreachable_endpoint_exits_2(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    code = main(["--env", "dev", "--endpoint", f"http://127.0.0.1:{port}", "--timeout", "2"])
    line = one_line_error(capsys.readouterr().err)
    assert code == 2 and "cannot connect" in line and "Connection refused" in line


def test_cli_config_error_exits_2(capsys):
    assert main(["--env", "nope", "--endpoint", "http://127.0.0.1:9"]) == 2
    assert "unknown environment; valid environments: autopilot, dev, prod" in capsys.readouterr().err


def test_subprocess_drift_and_error_without_traceback(gke):
    gke.pool("v6e-4x4-0")["config"]["machineType"] = "ct6e-standard-8t"
    cmd = [sys.executable, "-m", "infra.doctor", "--env", "dev", "--endpoint", gke.url, "--timeout", "5"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr == "" and "ct6e-standard-8t" in proc.stdout
    gke.errors["cluster"] = (403, google_error(403, "PERMISSION_DENIED", "Permission denied on resource."))
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    one_line_error(proc.stderr)


def test_ray_is_not_imported_without_ray_address(gke):
    script = (
        "import sys; from infra.doctor import main; "
        f"code = main(['--env', 'dev', '--endpoint', {gke.url!r}]); "
        "print('ray imported' if 'ray' in sys.modules else 'no ray'); sys.exit(code)"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("no ray"), proc.stderr


# --- the Ray report's pure parts -------------------------------------------------------------------


def test_ray_shapes_are_ray_names_per_distinct_shape():
    assert [(s.groups, s.topology, s.accelerator_type, s.pod_type, s.configured_slices) for s in ray_shapes(PROD)] == [
        (("v6e-multislice",), "4x4", "TPU-V6E", "v6e-16", 2),
        (("ironwood", "ironwood-queued"), "2x2x2", "TPU-V7X", "v7x-16", 3),
        (("v5e-serving",), "2x4", "TPU-V5LITEPOD", "v5litepod-8", 2),
    ]


def test_bounded_gives_up_and_reports_errors_as_one_line():
    assert bounded(lambda: 42, 1.0, "asking") == 42
    start = time.monotonic()
    with pytest.raises(DoctorError, match="asking failed: no answer within 0.2 s"):
        bounded(lambda: time.sleep(2), 0.2, "asking")
    assert time.monotonic() - start < 1.0
    with pytest.raises(DoctorError, match="asking failed: ConnectionError: no GCS at 1.2.3.4"):
        bounded(lambda: (_ for _ in ()).throw(ConnectionError("no GCS at 1.2.3.4\nmore")), 1.0, "asking")


def test_default_endpoint_without_credentials_is_one_line(tmp_path):
    # google.auth's own lookup with nothing to find: no ADC file, no gcloud config, not on GCE
    # (NO_GCE_CHECK is read at import, hence a subprocess).
    env = {k: v for k, v in os.environ.items() if k != "GOOGLE_APPLICATION_CREDENTIALS"}
    env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"), NO_GCE_CHECK="true")
    proc = subprocess.run(
        [sys.executable, "-m", "infra.doctor", "--env", "dev"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    line = one_line_error(proc.stderr)
    assert proc.returncode == 2 and "no Google credentials" in line and "gcloud auth application-default login" in line


# --- the cluster's KubeRay CRD (--kubectl), through the real kubectl against a local API server -----


def shared_crd(name: str = "kuberay/crds/ray.io_rayclusters.yaml") -> dict:
    path = REPO.parent / "shared" / name
    if not path.is_file():
        pytest.skip(f"../shared/{name} is not here")
    return yaml.safe_load(path.read_text())


def served_crds() -> dict[str, dict]:
    """The KubeRay and Kueue CRDs a cluster with the add-on and Kueue v0.19.2 installed serves."""
    out = {"rayclusters.ray.io": shared_crd(), "rayjobs.ray.io": shared_crd("kuberay/crds/ray.io_rayjobs.yaml")}
    for kind in ("clusterqueues", "localqueues", "resourceflavors", "provisioningrequestconfigs"):
        out[f"{kind}.kueue.x-k8s.io"] = shared_crd(f"kueue/crds/kueue.x-k8s.io_{kind}.yaml")
    return out


def test_the_crd_check_finds_the_fields_the_manifests_use():
    crd = shared_crd()
    (check,) = kuberay_crd.check(DEV, crd)
    assert check.feature.field == "authOptions.mode" and check.feature.since == "1.5.1" and check.known
    older = copy.deepcopy(crd)  # a KubeRay before 1.5.1: no authOptions in its schema
    for version in older["spec"]["versions"]:
        version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"].pop("authOptions", None)
    (check,) = kuberay_crd.check(DEV, older)
    assert not check.known


# Without authOptions: the same CLI path, the check that fails it pure above; make test-slow runs it.
@pytest.mark.parametrize("has_auth_options", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_cli_kubectl_reports_a_kuberay_too_old_for_the_manifests(gke, tmp_path, has_auth_options):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    crd = shared_crd()
    if not has_auth_options:
        for version in crd["spec"]["versions"]:
            version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"].pop("authOptions", None)
    with serve(FakeKube(crds={**served_crds(), "rayclusters.ray.io": crd})) as kube:
        env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig(tmp_path)), "HOME": str(tmp_path)}
        cmd = [sys.executable, "-m", "infra.doctor", "--env", "dev", "--endpoint", gke.url, "--timeout", "10", "--kubectl"]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert "CRD rayclusters.ray.io" in proc.stdout and "authOptions.mode" in proc.stdout, proc.stdout + proc.stderr
    if has_auth_options:
        assert proc.returncode == 0 and "all" in proc.stdout.splitlines()[-1]
    else:
        assert proc.returncode == 1 and "unknown field" in proc.stdout
        assert proc.stdout.splitlines()[-1].endswith("CRD rayclusters.ray.io authOptions.mode")


def test_cli_kubectl_without_the_crd_is_one_line(gke, tmp_path):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    with serve(FakeKube()) as kube:
        env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig(tmp_path)), "HOME": str(tmp_path)}
        cmd = [sys.executable, "-m", "infra.doctor", "--env", "dev", "--endpoint", gke.url, "--timeout", "10", "--kubectl"]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    line = one_line_error(proc.stderr)
    assert proc.returncode == 2 and "cannot read the rayclusters.ray.io CRD" in line and "not found" in line


def test_the_rayjob_and_kueue_crds_are_checked_for_the_fields_we_print():
    crds = served_crds()
    fields = kuberay_crd.required_fields(PROD)  # prod has Kueue and queued provisioning
    assert {f.crd for f in fields} == set(crds) - {"rayclusters.ray.io"}
    assert all(kuberay_crd.knows_field(crds[f.crd], f) for f in fields)
    assert {f.crd for f in kuberay_crd.required_fields(DEV)} == {"rayjobs.ray.io"}  # no Kueue in dev
    older = copy.deepcopy(crds["rayjobs.ray.io"])  # a KubeRay before 1.6.0: no preRunningDeadlineSeconds
    for version in older["spec"]["versions"]:
        version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"].pop("preRunningDeadlineSeconds", None)
    (field,) = [f for f in fields if f.field == "preRunningDeadlineSeconds"]
    assert not kuberay_crd.knows_field(older, field)
    v1beta1_only = copy.deepcopy(crds["clusterqueues.kueue.x-k8s.io"])  # a Kueue before v1beta2
    v1beta1_only["spec"]["versions"] = [v for v in v1beta1_only["spec"]["versions"] if v["name"] == "v1beta1"]
    (field,) = [f for f in fields if f.crd == "clusterqueues.kueue.x-k8s.io" and f.field == "admissionChecksStrategy"]
    assert not kuberay_crd.knows_field(v1beta1_only, field)


def test_cli_kubectl_without_kueue_installed_is_one_line(tmp_path):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    crds = {k: v for k, v in served_crds().items() if not k.endswith("kueue.x-k8s.io")}
    gke = FakeGke().start().serve(PROD)
    try:
        with serve(FakeKube(crds=crds)) as kube:
            env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig(tmp_path)), "HOME": str(tmp_path)}
            cmd = [sys.executable, "-m", "infra.doctor", "--env", "prod", "--endpoint", gke.url, "--timeout", "10", "--kubectl"]
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    finally:
        gke.stop()
    line = one_line_error(proc.stderr)
    assert proc.returncode == 2 and "cannot read the clusterqueues.kueue.x-k8s.io CRD" in line and "is Kueue installed" in line
