"""Triage is a stage (mambafuzz.search.triage) and the findings store a database
(mambafuzz.store.finding_store): the store only saves and lists, and the judge's typed
`Violation` is what a worker files and reports to the supervisor."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from mambafuzz.findings import Violation
from mambafuzz.search.worker_protocol import parse_event
from mambafuzz.store.finding_store import FindingStore
from tests.conftest import first_chunk_scenario

STORE = Path(__file__).resolve().parents[2] / "mambafuzz" / "store"


def test_the_store_imports_nothing_from_checks_or_search():
    """Function-level imports included: the store saves, fetches and lists; it never judges."""
    offenders = []
    for path in sorted(STORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.startswith(("mambafuzz.checks", "mambafuzz.search"))]
    assert not offenders, offenders


def test_the_store_saves_lists_and_reads_back_filed_signatures(tmp_path):
    store = FindingStore(tmp_path)
    scenario = first_chunk_scenario()
    path = store.path_for("prefix-slot_hash:short|x,y")
    assert path == tmp_path / "prefix-slot_hash-short-x-y.json"
    store.save(path, scenario, {"signature": "slot_hash:short", "fine_signature": "slot_hash:short|x,y",
                                "split": "prefix"}, "a note")
    pre = store.path_for("prefix-stall:step-bound", pre_existing=True)
    store.save(pre, scenario, {"signature": "stall:step-bound", "pre_existing": True}, "")
    store.save_raw("prefix-slot_hash:short|x,y", scenario.dumps(), ".decoded.json")  # a raw input: not a finding
    assert sorted(c.path for c in store.list()) == sorted([path, pre])
    assert store.fetch(path).scenario == scenario
    assert store.filed_signatures("prefix") == ({"slot_hash:short|x,y"}, {"stall:step-bound"})
    assert store.filed_signatures("fixed").new == set()


def test_a_worker_files_the_judges_violation_and_reports_it_in_its_finding_event(tmp_path, capsys):
    from mambafuzz.search import target_runtime
    from mambafuzz.search.worker_protocol import WorkerConfig

    rt = target_runtime.Runtime(WorkerConfig(split="prefix", findings=str(tmp_path), minimize_budget=1))
    scenario = first_chunk_scenario()
    judged = rt.judge.verdict(scenario)
    assert isinstance(judged, Violation) and judged.kind == "slot_hash"
    assert rt.run_scenario(scenario, {"input": "test"}) is True
    event = next(e for e in map(parse_event, capsys.readouterr().out.splitlines()) if e and e["event"] == "finding")
    assert Violation.from_json(event) == judged == rt.triage.filed[0].violation
    meta = json.loads(Path(event["path"]).read_text())["finding"]
    assert (meta["signature"], meta["fine_signature_found"], meta["message"]) == (
        judged.signature, judged.fine, judged.message)


def test_a_finding_event_without_a_signature_is_log_not_an_event():
    assert parse_event('@@event {"event":"finding","pid":1,"path":"x.json"}') is None
    assert Violation.from_json(parse_event('@@event {"event":"finding","pid":1,"signature":"stall:x"}')) == \
        Violation("stall:x")


def test_pr_mode_keeps_the_largest_gap_and_minimizes_without_shrinking_it(tmp_path):
    """An efficiency regression's fine signature is filed once; a later input that goes further
    past the base (a larger `gap`) is saved over it (at most MAX_REGAPS times), and minimizing
    keeps at least its gap: a smaller case with a smaller gap is not accepted."""
    import dataclasses

    from mambafuzz.checks.pipeline import Judge
    from mambafuzz.search import triage as triage_mod
    from mambafuzz.search.minimizer import MinimizeResult
    from mambafuzz.search.pr.against_base import MAX_REGAPS, AgainstBase

    def with_gap(gap: int):  # the scenario's token seed stands for how far past its base it goes
        return dataclasses.replace(first_chunk_scenario(), token_seed=gap)

    def verdict(s):
        return Violation("efficiency_regression:hits", f"hits {s.token_seed} fewer", gap=s.token_seed)

    tried: list[tuple[int, bool]] = []

    def minimizer(scenario, still_fails, time_budget):
        smaller = with_gap(scenario.token_seed - 1)  # a candidate that keeps the signature, not the gap
        tried.append((smaller.token_seed, still_fails(smaller)))
        return MinimizeResult(scenario, 1, 0, 0.0, False)

    t = triage_mod.Triage(FindingStore(tmp_path), "fixed", judge=Judge("fixed", verdict, lambda p, s: "repro"),
                          minimizer=minimizer, base=AgainstBase(lambda s: None), announce=False)
    first = t.handle(with_gap(2), verdict(with_gap(2)), {"input": "test"})
    assert first is not None and not first.replaces and tried == [(1, False)]
    assert t.handle(with_gap(1), verdict(with_gap(1)), {}) is None and t.duplicates == 1  # a smaller gap
    larger = t.handle(with_gap(5), verdict(with_gap(5)), {})
    assert larger is not None and larger.replaces and larger.path == first.path and tried[-1] == (4, False)
    assert [f.violation.gap for f in t.filed] == [5]
    assert json.loads(first.path.read_text())["finding"]["gap"] == 5
    for gap in range(6, 6 + MAX_REGAPS):
        t.handle(with_gap(gap), verdict(with_gap(gap)), {})
    assert t.regaps == {"efficiency_regression:hits": MAX_REGAPS}
    assert [f.violation.gap for f in t.filed] == [6 + MAX_REGAPS - 2]


def test_a_gap_crosses_the_worker_boundary_and_other_kinds_carry_none():
    v = Violation("efficiency_regression:steps", "m", gap=3)
    assert Violation.from_json(v.to_json()) == v
    assert "gap" not in Violation("slot_hash:short").to_json()


def test_the_supervisor_lists_a_larger_gap_once_in_place_of_the_case_it_replaced():
    import io
    from types import SimpleNamespace

    from mambafuzz.search.supervisor import Campaign

    out = io.StringIO()
    campaign = Campaign(SimpleNamespace(stats_file=None), out)
    worker = SimpleNamespace()
    base = {"event": "finding", "pid": 1, "signature": "efficiency_regression:hits", "path": "f.json"}
    campaign.handle(worker, "@@event " + json.dumps({**base, "gap": 2}))
    campaign.handle(worker, "@@event " + json.dumps({**base, "path": "g.json", "signature": "stall:x"}))
    campaign.handle(worker, "@@event " + json.dumps({**base, "gap": 5, "replaces": True}))
    assert [(e["path"], e.get("gap")) for e in campaign.filed] == [("g.json", None), ("f.json", 5)]
    assert "LARGER GAP efficiency_regression:hits" in out.getvalue()


def test_a_finding_an_untriaged_candidates_fix_explains_says_so_and_is_still_filed(tmp_path):
    """The partial-hit admission stall (corpus/untriaged) replays clean under its candidate fix: triage
    files it (untriaged is not known) and labels it with the candidate; without the candidates, no
    label."""
    from mambafuzz.checks.pipeline import oracle_judge
    from mambafuzz.search import triage as triage_mod
    from mambafuzz.search.minimizer import MinimizeResult
    from mambafuzz.store.corpus import load_case
    from mambafuzz.store.known_bugs import untriaged_candidates

    root = Path(__file__).resolve().parents[2] / "corpus" / "untriaged"
    scenario = load_case(root / "partial_hit_admission_stall_min_pool.json").scenario
    judge = oracle_judge("fixed")
    violation = judge.verdict(scenario)
    assert violation is not None and violation.kind == "stall"  # the stall is the headline, not its divergence

    def filed_meta(candidates, where):
        t = triage_mod.Triage(FindingStore(tmp_path / where), "fixed", judge=judge, known_bugs=[],
                              minimizer=lambda s, f, time_budget: MinimizeResult(s, 0, 0, 0.0, False),
                              announce=False, untriaged=candidates, repro_runs=1)
        return json.loads(t.handle(scenario, violation, {"input": "test"}).path.read_text())["finding"]

    candidates = untriaged_candidates([root])
    assert any(c.name == "untriaged candidate drop_unadmittable_hit" for c in candidates)
    meta = filed_meta(candidates, "with")
    assert meta["attribution"]["untriaged"] == "untriaged candidate drop_unadmittable_hit"
    assert meta["engine"] == {"real_engine_builds": True, "notes": []}  # this one's blocks are tied, as an engine's
    assert "untriaged" not in filed_meta([], "without").get("attribution", {})
    # another candidate's fix does not remove it: no label from that one
    from mambafuzz.checks import attribution

    other = [c for c in candidates if c.name == "untriaged candidate keep_aliased_speculative_block"]
    assert other and attribution.untriaged_explanation(scenario, "fixed", violation.signature, other) is None
