"""Kueue's admission ported as pure functions (infra.manifests.kueue_admission): each rule with the case
its Kueue v0.19.2 source line decides, Kueue's own unit-test message reproduced, and the defects of
issue 32 (a quota rounded down, a head given a TPU flavor) shown failing where the ported rule says."""

from __future__ import annotations

import copy
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from infra import quantity
from infra.config import load_environment
from infra.manifests.kueue import cluster_queue, resource_flavors
from infra.manifests.kueue_admission import Admitted, Flavor, PodSet, assign, pod_requests, pod_sets, preemption_targets
from infra.manifests.rayjob import RayJobRequest, ray_job

OURS = "us-docker.pkg.dev/my-gcp-project/ray-tpu-gke/ray-tpu@sha256:" + "ab" * 32
PROD = load_environment("prod", tpu_image=OURS)
REQUEST = RayJobRequest(
    name="hc-0a1b2c3d",
    job="healthcheck",
    entrypoint="python -m jobs.healthcheck",
    group="v5e-serving",
    slices=1,
    active_deadline_s=3600,
    pre_running_deadline_s=600,
    ttl_after_finished_s=60,
)
JOB = ray_job(PROD, REQUEST)
QUEUE = cluster_queue(PROD)
FLAVORS = {d["metadata"]["name"]: Flavor.of(d) for d in resource_flavors(PROD)}


def container(requests: dict | None = None, limits: dict | None = None) -> dict:
    resources = {**({"requests": requests} if requests else {}), **({"limits": limits} if limits else {})}
    return {"name": "c", "resources": resources}


def queue(*flavors: tuple[str, dict[str, str]], covered=("cpu", "memory"), preemption: str | None = None) -> dict:
    spec: dict = {
        "resourceGroups": [
            {
                "coveredResources": list(covered),
                "flavors": [{"name": n, "resources": [{"name": r, "nominalQuota": q[r]} for r in covered]} for n, q in flavors],
            }
        ]
    }
    if preemption:
        spec["preemption"] = {"withinClusterQueue": preemption}
    return {"kind": "ClusterQueue", "metadata": {"name": "q"}, "spec": spec}


def test_a_rayjob_is_kueues_podsets_in_every_submission_mode():
    head, worker, submitter = pod_sets(JOB)
    assert [(p.name, p.count) for p in (head, worker, submitter)] == [("head", 1), ("hc-0a1b2c3d", 1), ("submitter", 1)]
    assert submitter.requests() == {"cpu": 500, "memory": 200 * 2**20}  # our template's, as Kueue reads it (milli-cpu)
    sidecar = copy.deepcopy(JOB)
    sidecar["spec"].update(submissionMode="SidecarMode")
    [head_sc, _] = pod_sets(sidecar)  # rayjob_controller.go:313-332: the submitter joins the head
    assert head_sc.requests()["cpu"] == head.requests()["cpu"] + 500
    http = dict(sidecar, spec={**sidecar["spec"], "submissionMode": "HTTPMode"})
    assert [p.name for p in pod_sets(http)] == ["head", "hc-0a1b2c3d"]
    default = copy.deepcopy(JOB)
    default["spec"].pop("submitterPodTemplate")  # KubeRay's own submitter: the head's image, 500m / 200Mi
    assert pod_sets(default)[-1].requests() == {"cpu": 500, "memory": 200 * 2**20}
    multi = copy.deepcopy(JOB)
    multi["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(replicas=3, numOfHosts=4, groupName="Big")
    assert [(p.name, p.count) for p in pod_sets(multi)][1] == ("big", 12)  # lowercased; replicas x numOfHosts


def test_a_pods_requests_are_what_kueue_counts():
    assert pod_requests({"containers": [container(limits={"cpu": "2", "memory": "1Gi"})]}) == {"cpu": 2000, "memory": 2**30}
    pod = {
        "containers": [container({"cpu": "1", "memory": "100M"}), container({"cpu": "250m"})],
        "initContainers": [container({"cpu": "3"}), {**container({"cpu": "100m", "memory": "1k"}), "restartPolicy": "Always"}],
        "overhead": {"cpu": "10m"},
    }
    # 1.25 CPU + the 0.1 sidecar = 1.35, less than the first init container's 3; then the overhead.
    assert pod_requests(pod) == {"cpu": 3010, "memory": 100_001_000}
    assert pod_requests({"containers": [container({"memory": "1.5", "cpu": "0.0001"})]}) == {"memory": 2, "cpu": 1}  # rounded up


def test_kueues_own_insufficient_quota_message():
    # pkg/scheduler/flavorassigner/flavorassigner_test.go:697 (v0.19.2)
    podset = PodSet("main", 1, {"containers": [container({"cpu": "1", "memory": "10Mi"})]})
    verdict = assign([podset], queue(("b_one", {"cpu": "2", "memory": "1Mi"})), {})
    assert verdict.message == (
        "couldn't assign flavors to pod set main: insufficient quota for memory in flavor b_one, "
        "previously considered podsets requests (0) + current podset request (10Mi) > maximum capacity (1Mi)"
    )
    # Equal to the quota fits (strictly greater does not, flavorassigner.go:1346).
    assert assign([podset], queue(("b_one", {"cpu": "1", "memory": "10Mi"})), {}).fits


def test_a_head_takes_a_tpu_flavor_unless_the_flavor_is_tainted():
    """Kueue matches a pod against each flavor's own label keys only: the head's CPU-pool selector says
    nothing against a TPU flavor, so once the CPU flavor is full the head is given the TPU flavor (and
    its node labels, and never schedules). The TPU flavor's taint keeps it off."""
    head = pod_sets(JOB)[0]
    cpu_full = {(f"{PROD.cluster_name}-cpu", "cpu"): 10**9}
    untainted = {name: Flavor(f.name, f.node_labels) for name, f in FLAVORS.items()}
    verdict = assign([head], QUEUE, untainted, cpu_full)
    assert verdict.flavors["head"]["cpu"] == "ray-tpu-prod-v5e-serving"
    blocked = assign([head], QUEUE, FLAVORS, cpu_full)  # it waits for room on the CPU flavor instead
    assert blocked.preempt and blocked.flavors["head"]["cpu"] == f"{PROD.cluster_name}-cpu"
    assert blocked.needs == ((f"{PROD.cluster_name}-cpu", "cpu"),)
    too_big = PodSet("head", 1, {**head.pod, "containers": [container({"cpu": "1000"})]})  # past the CPU flavor's quota
    message = assign([too_big], QUEUE, FLAVORS).message
    assert "insufficient quota for cpu in flavor ray-tpu-prod-cpu" in message
    assert "untolerated taint {google.com/tpu present NoSchedule <nil>} in flavor ray-tpu-prod-v5e-serving" in message
    # A flavor's own tolerations cancel its taints for admission (flavorassigner.go:1238-1245).
    tolerating = {
        **FLAVORS,
        "ray-tpu-prod-v5e-serving": Flavor(
            "ray-tpu-prod-v5e-serving",
            {},
            FLAVORS["ray-tpu-prod-v5e-serving"].node_taints,
            ({"key": "google.com/tpu", "operator": "Exists"},),
        ),
    }
    assert assign([head], QUEUE, tolerating, cpu_full).flavors["head"]["cpu"] == "ray-tpu-prod-v5e-serving"


def test_the_printed_job_takes_its_flavors_and_its_workers_tolerate_only_their_own():
    verdict = assign(pod_sets(JOB), QUEUE, FLAVORS)
    assert verdict.fits and verdict.flavors == {
        "head": dict.fromkeys(("cpu", "memory"), "ray-tpu-prod-cpu"),
        "hc-0a1b2c3d": dict.fromkeys(("cpu", "memory", "google.com/tpu"), "ray-tpu-prod-v5e-serving"),
        "submitter": dict.fromkeys(("cpu", "memory"), "ray-tpu-prod-cpu"),
    }
    worker = pod_sets(JOB)[1]
    untolerating = PodSet(worker.name, 1, {**worker.pod, "tolerations": []})
    assert "untolerated taint {google.com/tpu present NoSchedule <nil>}" in assign([untolerating], QUEUE, FLAVORS).message
    # Alone with the queued-provisioning flavor, the v5e worker is refused by its gke-queued taint.
    only_dws = copy.deepcopy(QUEUE)
    group = only_dws["spec"]["resourceGroups"][0]
    group["flavors"] = [f for f in group["flavors"] if f["name"] == "ray-tpu-prod-ironwood-queued"]
    assert assign([worker], only_dws, FLAVORS).message == (
        f"couldn't assign flavors to pod set {worker.name}: "
        "untolerated taint {cloud.google.com/gke-queued true NoSchedule <nil>} in flavor ray-tpu-prod-ironwood-queued"
    )
    untainted = {
        "ray-tpu-prod-ironwood-queued": Flavor("ray-tpu-prod-ironwood-queued", FLAVORS["ray-tpu-prod-ironwood-queued"].node_labels)
    }
    assert "flavor ray-tpu-prod-ironwood-queued doesn't match node affinity" in assign([worker], only_dws, untainted).message


def test_a_workload_waits_for_room_and_preempts_only_lower_priorities():
    podset = PodSet("w", 1, {"containers": [container({"cpu": "4"})]})
    q = queue(("f", {"cpu": "8", "memory": "1"}), preemption="LowerPriority")
    one = {("f", "cpu"): 4000}
    low_old, low_new, high = Admitted("low-old", 1, 1.0, one), Admitted("low-new", 1, 2.0, one), Admitted("high", 100, 0.5, one)
    verdict = assign([podset], q, {}, {("f", "cpu"): 8000})
    assert verdict.preempt and verdict.needs == (("f", "cpu"),) and not verdict.fits and not verdict.message
    # The most recently admitted of the lowest priority goes first; one is enough.
    assert preemption_targets([podset], 50, q, {}, [low_old, low_new]) == [low_new]
    assert preemption_targets([podset], 50, q, {}, [high, low_old]) == [low_old]
    assert preemption_targets([podset], 1, q, {}, [low_old, low_new]) == []  # equal priority: never
    never = queue(("f", {"cpu": "8", "memory": "1"}))
    assert preemption_targets([podset], 50, never, {}, [low_old, low_new]) == []  # the default policy: Never
    big = PodSet("w", 1, {"containers": [container({"cpu": "8"})]})
    assert preemption_targets([big], 50, q, {}, [high, low_old]) == []  # evicting low-old alone makes no room


@given(st.decimals(min_value=0, max_value=Decimal(10) ** 18, places=4, allow_nan=False, allow_infinity=False))
def test_an_exact_quantity_is_never_less_and_never_in_exponent_form(value):
    text = quantity.exact(value)
    assert "e" not in text.lower() and "." not in text
    assert value <= quantity.parse(text) < value + Decimal("0.001")
    assert quantity.memory(value) == quantity.exact(quantity.parse(quantity.memory(value)))
