"""The batch bench's rerun target (pure): a rerun starts its engines again, so it is judged only
where vLLM alone, restarted at half, could meet it."""

from __future__ import annotations

import sys

from jobs import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import batch_bench


def test_the_rerun_floor_is_vllms_start_up_again_and_half_its_generation():
    # 2026-12-07, small model, 8192 prompts: vLLM in one process 240.6 s, of which generate 226.5 s.
    assert round(batch_bench.restart_floor(240.6, 226.5), 2) == 0.53
    # tiny model, 1024 prompts: 14.2 s, generate 2.9 s: start-up is most of the run.
    assert round(batch_bench.restart_floor(14.2, 2.9), 2) == 0.90


def test_the_rerun_is_judged_where_the_floor_allows_it_and_else_printed_for_the_record():
    assert batch_bench.rerun_verdict(189.0, 317.9, floor=0.53).endswith("<= 0.6x  met")
    assert batch_bench.rerun_verdict(200.0, 317.9, floor=0.53).endswith("<= 0.6x  NOT met")
    line = batch_bench.rerun_verdict(42.4, 46.1, floor=0.90)
    assert line.endswith("for the record (not judged: the floor here is 0.90x)")
    assert "met" not in line.split("<=")[1]  # neither met nor NOT met: not a target line
    assert "0.92x" in line  # the numbers are still said
