"""checkov on every environment's synthesized Terraform: zero failures, skips only the justified
ones in infra/checkov_scan.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.checkov_scan import ALWAYS, AUTOPILOT, FLEX, scan_stack, skips_for

pytestmark = pytest.mark.synth

CHECKOV = Path(__file__).resolve().parents[2] / ".venv-checkov" / "bin" / "checkov"


@pytest.mark.parametrize("env_name", ["dev", "prod", "autopilot"])
def test_no_failed_checks(stacks, env_name):
    if not CHECKOV.exists():
        pytest.fail("checkov is not installed: run `make setup`")
    stack = stacks[env_name]
    result = scan_stack(stack.path.parent, stack.env, str(CHECKOV))
    assert result.failed == []
    assert result.passed > 50


def test_every_skip_says_why():
    for check_id, reason in {**ALWAYS, **AUTOPILOT, **FLEX}.items():
        assert check_id.startswith("CKV") and len(reason) > 40


def test_auto_repair_is_skipped_only_where_flex_pools_need_it_off(stacks):
    # prod's queued-provisioning pools must not be repaired; dev has no flex pools, so checkov checks
    # every one of its pools for auto-repair.
    assert "CKV_GCP_9" in skips_for(stacks["prod"].env) and "CKV_GCP_9" not in skips_for(stacks["dev"].env)
