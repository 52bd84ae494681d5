"""Who can reach the Ray clusters, checked on the printed manifests (`python -m infra manifests`):
Ray token authentication on every Ray container, no token literal anywhere, every port Ray would
pick at random pinned, and NetworkPolicies that validate against Kubernetes' OpenAPI schema and
select exactly their own Ray cluster's pods.

Sources (read 2026-12-03): KubeRay @feeaf72 `utils/util.go` GetRayDashboardClientFunc (the operator
reads the token from the Secret `authOptions` names, or the one named after the RayCluster, key
`auth_token`) and `dashboardclient/dashboard_httpclient.go` setAuthHeader (it sends
`x-ray-authorization: Bearer <token>`), `common/pod.go` SetContainerTokenAuthEnvVars (it adds
RAY_AUTH_MODE / RAY_AUTH_TOKEN only to containers that lack them); `ray start --help` (Ray 2.60).
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from infra import ray_ports
from infra.config import ConfigError, environment_names, load_environment, parse_environment
from infra.manifests.network_policy import network_policy
from infra.manifests.raycluster import manifests
from infra.manifests.rayservice import ray_service, ray_service_name
from infra.names import RAY_CLUSTER_LABEL
from tests.infra.test_rayservice import dev_data

REPO = Path(__file__).resolve().parents[2]
KUBERNETES_VERSION = "1.33"  # the oldest GKE minor the release channels offer as read


@functools.cache
def _printed(env_name: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "infra", "manifests", "--env", env_name], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def printed(env_name: str) -> list[dict[str, Any]]:
    """What `python -m infra manifests --env NAME` prints (run once per environment)."""
    return list(yaml.safe_load_all(_printed(env_name)))


def every(env_name: str) -> list[dict[str, Any]]:
    env = load_environment(env_name)
    docs = manifests(env)
    if env.serving is not None:
        docs += [ray_service(env), network_policy(env, ray_service_name(env), serving=True)]
    return docs


def ray_cluster_specs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(kind, RayClusterSpec) of every Ray cluster in the documents."""
    out = []
    for d in docs:
        if d["kind"] == "RayCluster":
            out.append(("RayCluster", d["spec"]))
        elif d["kind"] == "RayService":
            out.append(("RayService", d["spec"]["rayClusterConfig"]))
    return out


def groups(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [spec["headGroupSpec"], *spec["workerGroupSpecs"]]


def pods(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, str]]]:
    """(Ray cluster, labels) of every pod template, with the labels KubeRay adds to each pod."""
    out = []
    for d in docs:
        if d["kind"] not in ("RayCluster", "RayService"):
            continue
        spec = d["spec"] if d["kind"] == "RayCluster" else d["spec"]["rayClusterConfig"]
        for group in groups(spec):
            kuberay = {"ray.io/cluster": d["metadata"]["name"], "ray.io/group": group.get("groupName", "headgroup")}
            out.append((d["metadata"]["name"], {**group["template"]["metadata"]["labels"], **kuberay}))
    return out


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector's meaning (matchLabels and matchExpressions), as Kubernetes defines it."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        has, value = e["key"] in labels, labels.get(e["key"])
        ok = {
            "In": has and value in e["values"],
            "NotIn": not has or value not in e["values"],
            "Exists": has,
            "DoesNotExist": not has,
        }[e["operator"]]
        if not ok:
            return False
    return True


@pytest.mark.parametrize("env_name", environment_names())
def test_every_ray_container_gets_the_token_from_a_secret_and_never_a_literal(env_name):
    docs = every(env_name)
    env = load_environment(env_name)
    assert ray_cluster_specs(docs), "no Ray cluster printed"
    for kind, spec in ray_cluster_specs(docs):
        assert spec["authOptions"] == {"mode": "token"}  # the operator knows the token, and sends it
        for group in groups(spec):
            for container in group["template"]["spec"]["containers"]:
                variables = {e["name"]: e for e in container.get("env", [])}
                if kind == "RayCluster":
                    assert variables["RAY_AUTH_MODE"] == {"name": "RAY_AUTH_MODE", "value": "token"}
                    ref = variables["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
                    # The Secret KubeRay creates for the RayCluster: its name, key auth_token.
                    assert ref == {"name": env.ray_cluster_name, "key": "auth_token"}
                else:  # KubeRay generates the RayService's RayCluster name: the operator injects both
                    assert "RAY_AUTH_TOKEN" not in variables and "RAY_AUTH_MODE" not in variables
    for d in docs:
        assert d["kind"] != "Secret"
    text = yaml.safe_dump_all(docs)
    assert "RAY_AUTH_TOKEN\n  value" not in text and "auth_token:" not in text


def test_no_token_literal_in_the_repo():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in tracked:
        path = REPO / name
        if path.suffix not in (".py", ".md", ".yaml", ".yml", ".sh", ".toml", "") or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            _, sep, value = line.partition("RAY_AUTH_TOKEN=")
            # A value that is not read at run time ("$(...)", "$VAR", a Python expression, a test's
            # deliberately wrong token) is a literal.
            if sep and value[:1] not in ('"', "$", "{", "'", "") and not value.startswith(("not-the-token", "wrong")):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert offenders == []


@pytest.mark.parametrize("env_name", environment_names())
def test_the_printed_objects_validate_strictly_against_kubernetes(env_name):
    for doc in printed(env_name):
        if doc["apiVersion"].startswith(("ray.io/", "kueue.x-k8s.io/")):
            continue  # validated against the KubeRay and Kueue CRDs (test_manifests.py, test_kueue.py)
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)  # raises on any error


@pytest.mark.parametrize("env_name", environment_names())
def test_each_policy_selects_exactly_its_own_ray_clusters_pods(env_name):
    docs = printed(env_name)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    every_pod = pods(docs)
    assert len(policies) == len(ray_cluster_specs(docs))  # one per Ray cluster
    for policy in policies:
        selected = {name for name, labels in every_pod if selects(policy["spec"]["podSelector"], labels)}
        (cluster,) = selected  # exactly one Ray cluster, all of whose pods it selects
        own = [labels for name, labels in every_pod if name == cluster]
        assert all(selects(policy["spec"]["podSelector"], labels) for labels in own)
        assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open (GCS, Artifact Registry)
        same_cluster = policy["spec"]["ingress"][0]["from"]
        assert same_cluster == [{"podSelector": policy["spec"]["podSelector"]}]  # its own pods, its own namespace
        assert {d["metadata"]["namespace"] for d in docs if "namespace" in d["metadata"]} == {policy["metadata"]["namespace"]}


def allowed(policy: dict[str, Any], rule: int) -> set[int]:
    out = set()
    for p in policy["spec"]["ingress"][rule]["ports"]:
        assert p["protocol"] == "TCP"
        out |= set(range(p["port"], p.get("endPort", p["port"]) + 1))
    return out


def ray_start_port_flags() -> set[str]:
    from ray.scripts.scripts import start

    return {p.name.replace("_", "-") for p in start.params if p.name.endswith("_port") or p.name.endswith("_port_list")}


def test_every_port_ray_would_choose_at_random_is_pinned_and_its_own_cluster_reaches_them_all():
    docs = printed("dev")
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    # Within a Ray cluster every port is open: Ray's workers listen on a range, and a range needs
    # `endPort`, which Cilium (GKE Dataplane V2) accepted and ignored (cilium/cilium#28684).
    assert policy["spec"]["ingress"][0] == {"from": [{"podSelector": policy["spec"]["podSelector"]}]}
    assert "endPort" not in yaml.safe_dump(policy)
    assert ray_ports.CILIUM_END_PORT.url.endswith("/issues/28684") and ray_ports.CILIUM_END_PORT.read  # the fact's source
    flags = ray_start_port_flags()
    head = cluster["spec"]["headGroupSpec"]["rayStartParams"]
    assert flags - {"worker-port-list"} <= set(head)  # every port flag of `ray start` but the alternative list
    assert {int(head[f]) for f in ("dashboard-port", "ray-client-server-port")} == {8265, 10001} and head["port"] == "6379"
    for group in cluster["spec"]["workerGroupSpecs"]:
        params = group["rayStartParams"]
        for flag in flags - {"worker-port-list", "dashboard-port", "ray-client-server-port"}:
            assert params[flag] == head[flag], f"{group['groupName']}: `ray start --{flag}` is not pinned like the head's"
    assert (head["min-worker-port"], head["max-worker-port"]) == ("10002", "19999")


def test_the_operator_reaches_the_dashboard_and_serve_prometheus_the_metrics_and_nobody_else_by_default():
    docs = printed("dev")
    cluster_policy, serve_policy = [d for d in docs if d["kind"] == "NetworkPolicy"]
    env = load_environment("dev")
    control_plane = [
        {"ipBlock": {"cidr": str(env.network.master_cidr)}},
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}},
        },
    ]
    assert cluster_policy["spec"]["ingress"][1]["from"] == control_plane and allowed(cluster_policy, 1) == {8265}
    assert serve_policy["spec"]["ingress"][1]["from"] == control_plane and allowed(serve_policy, 1) == {8265, 8000}
    gmp = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gmp-system"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "collector"}},
    }
    for policy in (cluster_policy, serve_policy):
        assert policy["spec"]["ingress"][2] == {"from": [gmp], "ports": [{"protocol": "TCP", "port": 8080}]}
        assert len(policy["spec"]["ingress"]) == 3  # no dashboard or Serve peers unless the config names them


def test_configured_peers_reach_the_dashboard_and_serve_only():
    data = dev_data()
    data["ray"] = {
        "access": {
            "dashboard_from": [{"namespace": "ci"}, {"pod_labels": {"app": "notebook"}}],
            "serve_from": [{"namespace": "web", "pod_labels": {"app": "gateway"}}],
            "operator_namespace": "ray-system",
        }
    }
    env = parse_environment(data)
    policy = network_policy(env, ray_service_name(env), serving=True)
    operator, dashboard, serve = (policy["spec"]["ingress"][i] for i in (1, 3, 4))
    assert operator["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ray-system"}}, "podSelector": {}}]
    assert dashboard["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ci"}}, "podSelector": {}},
        {"podSelector": {"matchLabels": {"app": "notebook"}}},
    ]
    assert allowed(policy, 3) == {8265, 10001}
    assert serve["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "web"}}, "podSelector": {"matchLabels": {"app": "gateway"}}}
    ]
    assert allowed(policy, 4) == {8000}
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize(
    ("access", "field"),
    [
        ({"dashboard_from": [{}]}, "ray.access.dashboard_from[0]"),
        ({"serve_from": [{"pod_labels": {"bad key!": "x"}}]}, "ray.access.serve_from[0].pod_labels"),
        ({"auth": "none"}, "ray.access.auth"),
        ({"operator_namespace": "Not_A_Name"}, "ray.access.operator_namespace"),
    ],
)
def test_a_bad_access_section_names_the_field(access, field):
    data = dev_data()
    data["ray"] = {"access": access}
    with pytest.raises(ConfigError) as caught:
        parse_environment(data)
    assert any(p.startswith(field) for p in caught.value.problems), caught.value.problems


def test_a_token_in_the_jobs_env_vars_is_refused():
    data = dev_data()
    data["ray"] = {"job_env_vars": {"RAY_AUTH_TOKEN": "x"}}
    with pytest.raises(ConfigError, match=r"ray.job_env_vars: .*RAY_AUTH_TOKEN must not be set here"):
        parse_environment(data)


def test_the_cluster_label_is_on_every_ray_pod():
    for _, labels in pods(printed("dev")):
        assert RAY_CLUSTER_LABEL in labels


def test_the_kuberay_auth_facts_are_data_with_their_source():
    from infra.platform_facts import GKE_RAY_ADDON_KUBERAY, KUBERAY_AUTH

    since = {f.field: f.since for f in KUBERAY_AUTH}
    assert since == {"authOptions.mode": "1.5.1", "authOptions.secretName": "1.6.0", "authOptions.enableK8sTokenAuth": "1.6.0"}
    assert all("feeaf72" in f.source.url and f.source.read for f in KUBERAY_AUTH)
    assert GKE_RAY_ADDON_KUBERAY is None  # Google does not publish it; `make show` names the minimum
    show = subprocess.run([sys.executable, "-m", "infra", "show", "--env", "dev"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "access: Ray token authentication (authOptions.mode, KubeRay >= 1.5.1; token in Secret ray-tpu-dev-ray)" in show.stdout
    # The CRDs this repo validates against (KubeRay @feeaf72) know every field the facts name.
    crds = REPO.parent / "shared" / "kuberay" / "crds"
    if not crds.is_dir():
        pytest.skip("../shared/kuberay/crds is not here")
    schema = yaml.safe_load((crds / "ray.io_rayclusters.yaml").read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    auth = schema["properties"]["spec"]["properties"]["authOptions"]["properties"]
    assert {"mode", "secretName", "enableK8sTokenAuth"} <= set(auth) and auth["mode"]["enum"] == ["disabled", "token"]
