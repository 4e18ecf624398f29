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
