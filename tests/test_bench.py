"""The speed benchmark still runs end to end (its figures are read by people, not asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_pair_coverage_tells_a_preemption_after_output_from_one_in_prefill():
    from types import SimpleNamespace as NS

    from mambafuzz.search import state_coverage as pc
    from mambafuzz.sim.trace import Chunk

    def step(chunks=(), preempted=()):
        return NS(preempted=list(preempted), admissions=[], recv_done=[], writes=[], aborts=[],
                  chunks=[Chunk(rid, start, n, 0, 0, 0, None, None, False, False) for rid, start, n in chunks])

    scenario = NS(engine=NS(mamba_block_size=8))
    trace = NS(prompts={"a": (1,) * 8, "b": (1,) * 8}, lru_evictions={}, continuations={},
               steps=[step([("a", 0, 6), ("b", 0, 4)]), step([("a", 6, 2)]), step(preempted=["a", "b"])])
    assert pc.event_dimensions(scenario, trace) == {"event:preempted-with-output", "event:preempted-in-prefill"}
    trace.steps[1].chunks = []  # a never ran past its prompt
    assert pc.event_dimensions(scenario, trace) == {"event:preempted-in-prefill"}


@pytest.mark.parametrize("generator", ["random", "pairs"])
def test_pair_coverage_counts_are_consistent(tmp_path, generator):
    from mambafuzz.search import state_coverage as pc

    assert {name for name, _ in pc.KNOBS}.isdisjoint(pc.EVENTS)
    out = subprocess.run([sys.executable, "bench/pair_coverage.py", "12", "--rarest", "3", "--generator", generator,
                          "--json", str(tmp_path / "pairs.json")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads((tmp_path / "pairs.json").read_text())
    runs, dims = report["executions"], report["dimensions"]
    assert 0 < runs <= 12 and set(dims) == set(pc.ALL_DIMENSIONS) and report["generator"] == generator
    assert any(dims.values()), "no dimension seen in any execution"
    for pair, count in report["pairs"].items():  # a pair occurs no more often than either of its halves
        a, b = pair.split(" + ")
        assert 0 < count <= min(dims[a], dims[b]) <= runs, pair
    assert "pairs of the" in out.stdout and "rarest pairs" in out.stdout
    bad = subprocess.run([sys.executable, "bench/pair_coverage.py", "0"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode == 2 and "at least 1" in bad.stderr and "Traceback" not in bad.stderr


def test_draw_detection_compares_the_same_seeds_with_and_without_a_draw(capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import draw_detection
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert draw_detection.main(["--seeds", "24", "--mutants", "preempt_keeps_computed"]) == 0
    out = capsys.readouterr().out
    changed = int(out.split("changes ")[1].split()[0])
    assert changed > 0, out  # some of 24 seeds draw the decode pressure
    assert "preempt_keeps_computed" in out and "total detections:" in out
    assert draw_detection.main(["--draw", "_draw_nothing"]) == 2
    assert draw_detection.main(["--mutants", "no_such_bug"]) == 2
    assert "unknown planted bug" in capsys.readouterr().err


@pytest.mark.parametrize("bench, args", [
    ("mutation_score", ["--mutants", "resource_state_freed_late", "--seeds", "1"]),
    ("mutation_run", ["--targets", "split", "--mutants", "mm:Scheduler._mamba_block_aligned_split:0"]),
])
def test_the_mutation_benches_refuse_a_base_that_names_no_vllm_in_one_line(bench, args):
    """A --base `fuzz` would refuse is the bench's usage error, not a run whose campaigns all end at
    once and read as survivors."""
    out = subprocess.run([sys.executable, f"bench/{bench}.py", *args, "--base", "/nonexistent"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    err = [line for line in out.stderr.splitlines() if not line.startswith("Triton")]
    assert err == [f"{bench}: --base /nonexistent: not 'installed' nor a directory holding vllm/ "
                   "(make one with ci/pr-overlay)"], err


def test_a_campaign_fuzz_refuses_is_a_tool_error_for_the_mutation_benches(monkeypatch):
    """Exit 2 (a usage error) from `fuzz` means no campaign ran: a tool error, never a survivor."""
    import subprocess as sp

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import mutation_run
        import mutation_score
    finally:
        sys.path.remove(str(ROOT / "bench"))
    refused = sp.CompletedProcess([], 2, "", "mambafuzz: --base x: not 'installed'\n")
    monkeypatch.setattr(mutation_score.subprocess, "run", lambda *a, **k: refused)
    monkeypatch.setattr(mutation_run.subprocess, "run", lambda *a, **k: refused)
    row = mutation_score.hunt("resource_state_freed_late", "random", 1, 5.0, "x")
    assert row["tool_error"] == "mambafuzz: --base x: not 'installed'" and not row["killed"]
    assert mutation_run.campaign("mm:Scheduler._mamba_block_aligned_split:0", "random", 5.0, 5.0, None)["status"] == "tool-error"
