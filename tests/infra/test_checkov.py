"""checkov on every environment's synthesized Terraform: zero failures, skips only the justified
ones in infra/checkov_scan.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.checkov_scan import ALWAYS, AUTOPILOT, scan_stack

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
    for check_id, reason in {**ALWAYS, **AUTOPILOT}.items():
        assert check_id.startswith("CKV") and len(reason) > 40
