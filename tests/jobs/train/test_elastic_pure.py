"""The pure rules of spot slices: what a notice leads the workers to do (jobs.train.notice), which
slices an elastic run takes and when it grows (jobs.train.elastic), and gradient accumulation giving
the batch's own loss and gradients (jobs.train.accumulate)."""

from __future__ import annotations

import numpy as np
import pytest

from jobs.train import config as train_config
from jobs.train import elastic, notice

# --- a preemption notice -------------------------------------------------------------------------


def test_a_notice_with_time_for_a_save_saves_the_step_just_finished():
    plan = notice.plan_on_notice(23, remaining_s=10.0, save_estimate_s=2.0, committed_step=20, saving_step=None)
    assert plan.save and "saving step 23" in plan.why


def test_a_notice_shorter_than_the_longest_save_keeps_the_last_checkpoint_and_says_which():
    plan = notice.plan_on_notice(23, remaining_s=2.0, save_estimate_s=2.0, committed_step=20, saving_step=None)
    assert not plan.save
    assert "shorter than a save (2.0 s" in plan.why and "resuming from step 20" in plan.why
    # The margin: a save must fit 1.25 times.
    assert notice.plan_on_notice(23, 2.5, 2.0, 20, None).save
    assert not notice.plan_on_notice(23, 2.4, 2.0, 20, None).save


def test_a_notice_past_its_deadline_saves_nothing_whatever_is_known():
    for estimate in (None, 0.1):
        plan = notice.plan_on_notice(7, remaining_s=0.0, save_estimate_s=estimate, committed_step=None, saving_step=None)
        assert not plan.save and "resuming from the start (no checkpoint yet)" in plan.why


def test_no_deadline_or_no_measured_save_tries_the_save():
    assert notice.plan_on_notice(5, None, 3.0, None, None).save
    assert notice.plan_on_notice(5, 4.0, None, None, None).save


def test_a_step_already_committed_or_being_saved_is_not_saved_twice():
    assert not notice.plan_on_notice(30, 10.0, 1.0, committed_step=30, saving_step=None).save
    plan = notice.plan_on_notice(30, 10.0, 1.0, committed_step=20, saving_step=30)
    assert plan.save and "waiting for its commit" in plan.why


def test_remaining_reads_rays_deadline_in_milliseconds():
    assert notice.remaining_s(0, 100.0) is None and notice.remaining_s(None, 100.0) is None
    assert notice.remaining_s(112_500, 100.0) == pytest.approx(12.5)
    assert notice.remaining_s(90_000, 100.0) == 0.0


def test_the_save_timer_keeps_the_longest_save_seen():
    timer = notice.SaveTimer()
    assert timer.longest_s is None
    timer.measured(1.5)
    timer.measured(0.5)
    timer.started()
    timer.poll(in_progress=True)  # still writing: nothing measured yet
    assert timer.longest_s == 1.5
    timer.poll(in_progress=False)
    assert timer.longest_s == 1.5  # the short one just finished does not lower it


# --- elastic slices -------------------------------------------------------------------------------


def test_an_elastic_run_shrinks_to_divisors_of_its_slices_only():
    assert elastic.sizes(4, 1) == (4, 2, 1)
    assert elastic.sizes(6, 2) == (6, 3, 2)
    assert elastic.sizes(2, 2) == (2,)
    assert elastic.pick(4, 1, idle=3) == 2  # three whole slices: the run takes two (4 / 2 micro-batches)
    assert elastic.pick(4, 1, idle=4) == 4
    assert elastic.pick(4, 2, idle=1) is None  # wait for two


def test_min_slices_that_no_divisor_meets_is_refused_naming_what_would_do():
    assert elastic.size_problem(2, 1) is None and elastic.size_problem(3, 3) is None
    problem = elastic.size_problem(3, 2)
    assert problem and "divisor of 3" in problem and "pass one of 1 or 3" in problem
    assert "more than --slices 2" in (elastic.size_problem(2, 3) or "")


def test_the_cli_refuses_a_min_slices_it_cannot_keep(capsys):
    base = ["--generation", "v4", "--topology", "2x2x2", "--slices", "3", "--storage", "/tmp/x", "--batch-size", "48"]
    with pytest.raises(SystemExit) as caught:
        train_config.parse_config([*base, "--min-slices", "2"], read_files=False)
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m jobs.train: error: argument --min-slices: ")
    _, config, *_ = train_config.parse_config([*base, "--min-slices", "1"], read_files=False)
    assert (config.slices, config.min_slices, config.accumulation) == (3, 1, 1)


def test_the_global_batch_is_kept_by_accumulating_micro_batches():
    assert elastic.accumulation(2, 1) == 2 and elastic.accumulation(4, 2) == 2 and elastic.accumulation(3, 3) == 1
    with pytest.raises(ValueError):
        elastic.accumulation(4, 3)


def test_growth_needs_a_larger_allowed_size_to_be_idle():
    assert not elastic.plan_growth(2, 2, 1, idle=5).grow  # on every slice
    assert not elastic.plan_growth(1, 4, 1, idle=0).grow
    assert elastic.plan_growth(1, 4, 1, idle=1) == elastic.GrowPlan(True, 2, "1 whole idle slice(s): growing from 1 to 2 slices")
    assert elastic.plan_growth(1, 4, 1, idle=3).slices == 4
    assert not elastic.plan_growth(2, 4, 1, idle=1).grow  # 3 slices would not divide 4


# --- gradient accumulation ------------------------------------------------------------------------


def test_micro_batches_spread_over_the_batch_not_its_first_rows():
    from jobs.train.accumulate import micro_batches

    rows = np.arange(8)[:, None]
    got = np.asarray(micro_batches(rows, 2))
    assert got[:, :, 0].tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_accumulated_loss_and_gradients_equal_the_whole_batchs():
    import jax

    from jobs.train import accumulate
    from jobs.train.data import synthetic_tokens
    from jobs.train.model import PRESETS, init_params, loss_fn, with_overrides

    cfg = with_overrides(PRESETS["tiny"], seq_len=16, vocab=64)
    params = init_params(cfg, 0)
    tokens = synthetic_tokens(np.arange(8), cfg.seq_len, cfg.vocab)
    whole, grads = jax.value_and_grad(loss_fn)(params, tokens, cfg)
    parts, part_grads = accumulate.value_and_grad(loss_fn, 4)(params, tokens, cfg)
    assert float(parts) == pytest.approx(float(whole), abs=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(part_grads), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6)
