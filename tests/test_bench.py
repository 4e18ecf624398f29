"""The speed benchmark still runs end to end (its figures are read by people, not asserted)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_harness_speed_bench_runs_and_reports_every_figure():
    out = subprocess.run(
        [sys.executable, "bench/harness_speed.py", "--reps", "1", "--number", "1", "--window", "1", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    for key in ("harness_one_run_over_bare", "evaluate_over_bare_two_runs", "tests10k_over_harness_evaluate",
                "fresh10k_over_harness_evaluate"):
        assert report[key] > 0, key
    assert set(report["steady_suite_ms"]) == {"harness1", "evaluate", "fresh10k1", "fresh10k", "tests10k1", "tests10k"}
    for name, row in report["scenarios"].items():
        assert row["harness_steps"] == row["bare_steps"], name  # both loops take the same steps
        assert row["clean"], name


def test_harness_cost_split_stubs_real_pieces_and_prints_every_variant():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import harness_cost_split
    finally:
        sys.path.remove(str(ROOT / "bench"))
    stubs = harness_cost_split._stubs()
    for name, patches in stubs.items():  # a renamed piece would be stubbed under a name nothing calls
        for owner, attr, _ in patches:
            assert hasattr(owner, attr), (name, attr)
    out = subprocess.run([sys.executable, "bench/harness_cost_split.py", "--reps", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    for name in ("bare", *stubs):
        assert any(line.startswith(name) for line in out.stdout.splitlines()), name
