"""Spot slices without lost work, on two simulated v4 2x2x2 slices (two hosts each), with the GCS's
health checks as the manifests set them (infra.disruption):

- a host preempted with a notice: the workers save the step they are at inside the notice, the
  attempt ends `preempted`, the next one restores that step: at most one step's work wasted;
- a notice shorter than a save: no save is tried, the run resumes from the checkpoint before, and
  the ledger says why;
- a host killed while the notice's save runs, then a second notice while the run restarts: nothing
  committed is lost, and the run still ends at the asked step;
- elastic (`--min-slices 1`): a run on two slices that loses one trains on the one left (the ledger's
  attempt_start says so) with the same global batch, so its losses equal those of a run that never
  lost a slice, and grows back to two at a step boundary when the slice returns.

Each is a few Ray Train runs with faults between them: minutes on 2 cores, so `make test-slow`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from infra import catalog, disruption
from jobs.runtime import goodput, ledger
from jobs.runtime.outcomes import HostLost, Preempted, Resized, Succeeded
from jobs.train import elastic
from tests.jobs.sim import SimHost, simulated_cluster, slice_hosts
from tests.jobs.train.test_fit_faults import BackgroundFit, newest_checkpoint_step

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# The smallest multi-host slice Ray Train places as such: Ray reads a v6e 2x4 as one 8-chip host
# (ray.util.tpu.get_tpu_worker_resources), so its 2 x 4-chip form cannot be simulated through it.
SHAPE = catalog.shape("v4", "2x2x2")
SLICES = ("sim-v4-a", "sim-v4-b")
TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "16", "--vocab", "64", "--batch-size", "32"]
STEPS, EVERY = 40, 10


@pytest.fixture(scope="module")
def two_slices(ray_tmp):
    hosts = [h for name in SLICES for h in slice_hosts(SHAPE, name)]
    with simulated_cluster(hosts, system_config=disruption.HEALTH.system_config()) as sim:
        yield sim


@pytest.fixture
def sim(two_slices):
    """Both slices whole and idle, whatever the test before did to them."""
    for name in SLICES:
        for host in slice_hosts(SHAPE, name):
            if (host.slice_name, host.worker_id) not in two_slices.nodes:
                two_slices.add_host(host)
    from jobs.runtime.inventory import wait_for_slices

    wait_for_slices(SHAPE, 2, 120)
    return two_slices


def argv(tmp_path: Path, name: str, *extra: str) -> list[str]:
    return [
        *("--generation", "v4", "--topology", "2x2x2", "--slices", "2"),
        *("--name", name, "--storage", str(tmp_path), "--steps", str(STEPS), "--checkpoint-every", str(EVERY)),
        *("--max-preemptions", "3", "--reserve-timeout", "120", "--learning-rate", "0.02", "--warmup-steps", "1"),
        *("--compilation-cache", str(tmp_path / "xla-cache")),
        *TINY,
        *extra,
    ]


def events_of(tmp_path: Path, name: str) -> list[dict]:
    return ledger.read_events(ledger.ledger_uri(str(tmp_path / name)))


def wait_for_event(tmp_path: Path, name: str, kind: str, attempt: int, timeout_s: float = 300) -> dict:
    """The first `kind` event of `attempt` in the run's ledger, waited for (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = [e for e in events_of(tmp_path, name) if e["event"] == kind and e.get("attempt") == attempt]
        except Exception:  # not written yet
            found = []
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no {kind} event of attempt {attempt} within {timeout_s:.0f} s")


def test_a_host_preempted_with_a_notice_saves_that_step_and_the_next_attempt_resumes_there(sim, tmp_path):
    fit = BackgroundFit(argv(tmp_path, "notice"))
    fit.checkpointed(tmp_path / fit.name, EVERY, STEPS)
    sim.preempt_host(SimHost(SHAPE, SLICES[1], 1), notice_s=12, back_after_s=1)

    report = fit.report()
    first, second = report.attempts
    assert isinstance(first.outcome, Preempted) and first.outcome.saved_step is not None, first.describe()
    assert isinstance(second.outcome, Succeeded)
    saved = first.outcome.saved_step
    assert report.value.start_step == saved and report.value.steps == STEPS

    events = events_of(tmp_path, fit.name)
    [told] = [e for e in events if e["event"] == "notice"]
    assert told["step"] == saved and told["save"] is True and 0 < told["remaining_s"] <= 12
    [took] = [e for e in events if e["event"] == "saved_now"]
    assert took["step"] == saved and took["seconds"] < told["remaining_s"]
    assert [(e["attempt"], e["step"]) for e in events if e["event"] == "restored"] == [(2, saved)]
    assert [e["attempt"] for e in events if e["event"] == "initialized"] == [1]  # no random init after the first
    # Not one step was run past the saved one: nothing wasted.
    assert max(e["step"] for e in events if e["event"] == "step" and e["attempt"] == 1) == saved
    account = goodput.account(events)
    assert account.badput_s[goodput.BadputType.WASTED_PROGRESS_FROM_DISRUPTION] == 0
    assert account.last_step == STEPS and account.disruptions == 1
    assert [e["outcome"] for e in events if e["event"] == "attempt_end"] == ["preempted", "succeeded"]


def test_a_notice_shorter_than_a_save_resumes_from_the_checkpoint_before_and_the_ledger_says_so(sim, tmp_path):
    fit = BackgroundFit(argv(tmp_path, "short"))
    at = fit.checkpointed(tmp_path / fit.name, EVERY, STEPS)
    # Ray's drain deadline half a second away, the host stopped 8 s later (a pod whose grace period
    # outlasts Ray's drain): the workers hear of the notice after its deadline.
    sim.preempt_host(SimHost(SHAPE, SLICES[0], 0), notice_s=0.5, kill_after_s=8, back_after_s=1)

    report = fit.report()
    first = report.attempts[0]
    assert isinstance(first.outcome, Preempted) and first.outcome.saved_step is None, first.describe()
    events = events_of(tmp_path, fit.name)
    [told] = [e for e in events if e["event"] == "notice"]
    assert told["save"] is False and "resuming from step" in told["why"], told
    assert not [e for e in events if e["event"] == "saved_now"]
    restored = [e["step"] for e in events if e["event"] == "restored"]
    assert restored and at <= restored[0] < told["step"]  # the periodic checkpoint before the notice
    assert report.value.steps == STEPS


def test_a_kill_during_the_notices_save_and_a_second_notice_during_the_restart_lose_nothing_committed(sim, tmp_path):
    fit = BackgroundFit(argv(tmp_path, "twice"))
    run_dir = tmp_path / fit.name
    fit.checkpointed(run_dir, EVERY, STEPS)
    noticed = sim.preempt_host(SimHost(SHAPE, SLICES[1], 0), notice_s=12, kill_after_s=60)
    wait_for_event(tmp_path, fit.name, "notice", 1)  # rank 0 says so, then saves: kill a host now
    committed_at_kill = newest_checkpoint_step(run_dir)
    sim.kill_host(SLICES[0], 1)
    sim.add_host(SimHost(SHAPE, SLICES[0], 1))
    noticed.join()
    sim.add_host(SimHost(SHAPE, SLICES[1], 0))
    # The run restarts; while its workers start, another host gets a notice.
    wait_for_event(tmp_path, fit.name, "workers_started", 2)
    committed_at_second = newest_checkpoint_step(run_dir)
    sim.preempt_host(SimHost(SHAPE, SLICES[0], 0), notice_s=12, back_after_s=1)

    report = fit.report(timeout_s=600)
    assert report.value.steps == STEPS
    assert all(isinstance(a.outcome, Preempted | HostLost) for a in report.attempts[:-1]), report.describe()
    events = events_of(tmp_path, fit.name)
    restored = [(e["attempt"], e["step"]) for e in events if e["event"] == "restored"]
    assert restored[0][1] >= committed_at_kill and all(step >= committed_at_second for _, step in restored), restored


def reference_losses(steps: int) -> list[float]:
    """The losses of the same model, data and optimizer trained in this process on one device,
    never losing anything: what an elastic run's must equal."""
    import jax

    from jobs.train import config as train_config
    from jobs.train.data import synthetic_batches
    from jobs.train.model import ModelConfig, init_params, make_optimizer, train_step

    _, config, *_ = train_config.parse_config(argv(Path("/nonexistent"), "reference"), read_files=False)
    cfg = ModelConfig(**config.model)
    optimizer = make_optimizer(config.learning_rate, warmup_steps=config.warmup_steps, total_steps=config.steps)
    params = init_params(cfg, config.seed)
    opt_state = optimizer.init(params)
    step = jax.jit(train_step(optimizer, cfg))
    losses = []
    batches = synthetic_batches(0, config.global_batch, 0, config.global_batch, cfg.seq_len, cfg.vocab)
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state, next(batches)["tokens"])
        losses.append(float(loss))
    return losses


def test_an_elastic_run_trains_on_the_slice_left_with_the_same_losses_and_grows_back(sim, tmp_path):
    assert elastic.accumulation(2, 1) == 2
    fit = BackgroundFit(argv(tmp_path, "elastic", "--min-slices", "1", "--resize-check", "3"))
    fit.checkpointed(tmp_path / fit.name, EVERY, STEPS)
    sim.kill_host(SLICES[1], 0)  # no notice: lost
    wait_for_event(tmp_path, fit.name, "step", 2)  # training again, on one slice, before the slice returns
    sim.add_host(SimHost(SHAPE, SLICES[1], 0))

    report = fit.report(timeout_s=600)
    kinds = [type(a.outcome) for a in report.attempts]
    assert kinds[0] in (HostLost, Preempted) and Resized in kinds and kinds[-1] is Succeeded, report.describe()
    events = events_of(tmp_path, fit.name)
    starts = [(e["attempt"], e["slices"], e["hosts"]) for e in events if e["event"] == "attempt_start"]
    assert starts[0] == (1, 2, 4) and starts[1] == (2, 1, 2) and starts[-1][1:] == (2, 4), starts
    [resize] = [e for e in events if e["event"] == "resize"]
    assert resize["slices"] == 2
    account = goodput.account(events)
    assert account.resizes == 1 and account.last_step == STEPS

    # The losses each attempt logged, step by step, equal a run that never lost a slice (float32;
    # the meshes' reduction orders differ: 1e-4).
    logged = {}
    for e in events:
        if e["event"] == "step":
            logged[e["step"]] = e["loss"]  # a step an attempt redid keeps the later attempt's
    expected = reference_losses(STEPS)
    got = np.array([logged[s] for s in range(1, STEPS + 1)])
    np.testing.assert_allclose(got, np.array(expected), rtol=0, atol=1e-4)
