"""The start-up and restart benches read what Ray Train and our ledger write (pure parts): Ray
Train's own worker-group breakdown from its controller's messages (Ray 2.60's wording), and the
restart milestones from a ledger."""

from __future__ import annotations

import sys

import pytest

from jobs import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import jobs_bench
import restart_bench

from tests.jobs.runtime.test_goodput_pure import attempt_events, ev

# As Ray Train 2.60's controller logs them (ray/train/v2/_internal/execution/worker_group/worker_group.py).
MESSAGES = [
    "[Worker Group Initialization] Placement group ready in 0.00s.",
    "[Worker Group Initialization] 4 worker actors created in 3.69s.",
    "[Worker Group Initialization] Train context initialized on workers in 0.55s.",
    "[Worker Group Initialization] after_worker_group_start callbacks completed in 4.20s.\n  Individual callback time "
    "breakdown:\n    ReportCallbackHandler: 0.00s\n    BackendSetupCallback: 4.16s\n    DatasetsCallback: 0.02s",
    "[Worker Group Initialization] Train function launched on workers in 0.05s.",
    "[Worker Group Initialization] after_worker_group_training_start callbacks completed in 0.00s.\n  Individual callback "
    "time breakdown:\n    BackendSetupCallback: 0.00s",
    "[Worker Group Initialization] Worker group startup completed in 10.07s total.",
]


def test_ray_trains_worker_group_breakdown_is_read_from_its_log():
    assert jobs_bench.ray_train_phases(MESSAGES) == {
        "placement group": 0.0,
        "worker actors": 3.69,
        "train context": 0.55,
        "jax.distributed": 4.16,
        "train fn launched": 0.05,
        "total": 10.07,
    }
    assert jobs_bench.ray_train_phases(["unrelated"]) == {}


def test_restart_milestones_come_from_the_ledger():
    first, t = attempt_events(1, 0.0, range(1, 7), first_s=5.0, step_s=1.0, every=4)
    killed = t + 0.5
    first += [ev(t + 3.0, "fit_failed"), ev(t + 10.0, "attempt_end", outcome="host-lost")]
    second, _ = attempt_events(2, t + 11.0, range(5, 9), first_s=1.5, step_s=1.0, every=4, restored=4)
    m = restart_bench.milestones(first + second, killed)
    assert (m["noticed"], m["detected"]) == (pytest.approx(2.5), pytest.approx(9.5))
    assert m["reserved"] == pytest.approx(11.0 + 2.0 - 0.5)  # the rerun started 11 s after the last step, its slices 2 s later
    assert m["restored_step"] == 4 and m["compile_2"] == pytest.approx(0.6) and m["lower_2"] == 0.4 and m["compile_wait_2"] == 0.25
    assert m["first_step_extra_2"] == pytest.approx(0.5)
    assert (m["hit_hosts_2"], m["hosts"]) == (1, 4)  # from the rerun's first step event
    assert m["training_again"] > m["restored"] > m["workers_up"] > m["reserved"]
