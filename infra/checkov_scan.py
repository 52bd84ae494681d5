"""The checkov checks we skip, each with the reason it does not apply. Everything else must pass
on every environment's synthesized Terraform (tests/infra/test_checkov.py, `make checkov`).

checkov's terraform_json scanner reads no inline skip comments, so the skips live here, per mode.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from infra.config import Environment, environment_names, load_environment

ALWAYS = {
    "CKV_GCP_12": "Dataplane V2 (datapath_provider ADVANCED_DATAPATH) enforces NetworkPolicy itself; "
    "the legacy network_policy block that this check looks for conflicts with it.",
    "CKV_GCP_65": "Google Groups for RBAC needs a Workspace `gke-security-groups` group, which belongs to "
    "an organisation, not to this repo; IAM roles govern access meanwhile.",
    "CKV_GCP_62": "Bucket access is audited through Cloud Audit Logs (Data Access logs); legacy usage logs "
    "would need a second bucket that itself fails this check.",
}

AUTOPILOT = {
    "CKV_GCP_61": "Autopilot manages intranode visibility; the field cannot be set on an Autopilot cluster.",
    "CKV_GCP_69": "Autopilot always runs the GKE metadata server; it rejects node_config, where the check looks.",
}


# Only where the environment has such pools (the skip is per stack: checkov's terraform_json scanner
# takes no per-resource skips, so the other pools' auto-repair goes unchecked there too; the
# synthesized pools' auto_repair is asserted in tests/infra/test_sweep.py instead).
FLEX = {
    "CKV_GCP_9": "flex-start and queued-provisioning pools must have auto-repair off (GKE and cluster-toolkit: "
    "'enable_flex_start needs node auto_repair set to false'; xpk creates them with --no-enable-autorepair).",
}


def skips_for(env: Environment) -> dict[str, str]:
    flex = any(g.capacity_kind in ("flex-start", "queued-provisioning") for g in env.slice_groups) and env.mode == "standard"
    return {**ALWAYS, **(AUTOPILOT if env.mode == "autopilot" else {}), **(FLEX if flex else {})}


@dataclass(frozen=True)
class ScanResult:
    stack: str
    passed: int
    failed: list[str]  # "CKV_GCP_x resource" for each failed check
    skipped: list[str]


def scan_stack(stack_dir: Path, env: Environment, checkov: str = ".venv-checkov/bin/checkov", timeout_s: float = 300) -> ScanResult:
    """Run checkov on one synthesized stack with that environment's justified skips."""
    cmd = [
        checkov,
        "-f",
        str(stack_dir / "cdk.tf.json"),
        "--framework",
        "terraform_json",
        "--skip-check",
        ",".join(skips_for(env)),
        "--output",
        "json",
        "--quiet",
        "--compact",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        raise RuntimeError(f"checkov failed on {stack_dir} (exit {proc.returncode}): {proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    results = report.get("results", {}) if isinstance(report, dict) else {}
    summary = report.get("summary", {}) if isinstance(report, dict) else {}
    return ScanResult(
        stack=stack_dir.name,
        passed=int(summary.get("passed", 0)),
        failed=[f"{c['check_id']} {c['resource']}" for c in results.get("failed_checks", [])],
        skipped=[c["check_id"] for c in results.get("skipped_checks", [])],
    )


def main(argv: list[str]) -> int:
    """`python -m infra.checkov_scan OUTDIR [CHECKOV]`: scan every synthesized stack."""
    outdir = Path(argv[0] if argv else "cdktf.out")
    checkov = argv[1] if len(argv) > 1 else ".venv-checkov/bin/checkov"
    bad = 0
    for name in environment_names():
        env = load_environment(name)
        stack_dir = outdir / "stacks" / env.stack_name
        if not stack_dir.is_dir():
            continue
        result = scan_stack(stack_dir, env, checkov)
        print(f"{result.stack}: {result.passed} passed, {len(result.failed)} failed, skipped {', '.join(sorted(skips_for(env)))}")
        for failure in result.failed:
            print(f"  FAILED {failure}")
        bad += len(result.failed)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
