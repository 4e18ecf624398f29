"""A new oracle is one module (its Finding subclass and check) plus one registration
(`mambafuzz.findings.register`): the judge, `expected` tables, triage and the exporter pick it
up from the registry.  The oracle here is registered by the test itself and gone after it."""

from __future__ import annotations

import json

import pytest

from mambafuzz import findings
from mambafuzz.checks.pipeline import evaluate, oracle_judge
from mambafuzz.search.triage import Triage
from mambafuzz.store import corpus
from mambafuzz.store.finding_store import FindingStore
from mambafuzz.upstream import export
from tests.conftest import shared_prefix_scenario

KIND = "test_crowd"
REPORT_KIND = "test_crowd_report"


class Crowd(findings.Finding):
    """A test-only verdict: more than one request generated tokens in the run."""

    kind = KIND


class CrowdReport(findings.Finding):
    kind = REPORT_KIND
    fails = False


def check_crowd(cached, uncached=None):
    served = sorted(rid for rid, tokens in cached.outputs.items() if tokens)
    return Crowd(f"{len(served)} requests generated tokens", location="two-or-more") if len(served) > 1 else None


def check_crowd_report(cached, uncached=None):
    found = check_crowd(cached, uncached)
    return None if found is None else CrowdReport(found.message, location=found.location)


@pytest.fixture
def crowd_oracle():
    """The whole of what a real oracle adds: its module (above) and one registration line."""
    findings.register(findings.Oracle(KIND, check=f"{__name__}:check_crowd", export=lambda location: findings.NO_CRASH))
    yield
    del findings.ORACLES[KIND]


def test_the_judge_runs_a_registered_check_after_the_built_in_ones(crowd_oracle):
    verdict = evaluate(shared_prefix_scenario(), "fixed", efficiency=False).verdict
    assert [f.kind for f in verdict.findings] == [KIND]
    assert verdict.violation == findings.Violation(f"{KIND}:two-or-more", "2 requests generated tokens",
                                                   f"{KIND}:two-or-more")


def test_an_oracle_declared_before_the_built_ins_is_the_primary_finding():
    """The first-chunk case fails slot_hash under the prefix split; a test-only oracle registered
    with an order below BUILT_IN_ORDER comes first (its signature is what a case is filed under),
    one with the default order after."""
    from tests.conftest import first_chunk_scenario

    def kinds(order):
        findings.register(findings.Oracle(KIND, check=f"{__name__}:check_crowd", order=order))
        try:
            return [f.kind for f in evaluate(first_chunk_scenario(), "prefix", efficiency=False).verdict.findings]
        finally:
            del findings.ORACLES[KIND]

    first, last = kinds(findings.BUILT_IN_ORDER - 1), kinds(findings.Oracle(KIND).order)
    assert first[0] == KIND and "slot_hash" in first[1:]
    assert last[0] == "slot_hash" and last[-1] == KIND and sorted(first) == sorted(last)


def test_without_the_registration_nothing_reports_it():
    assert KIND not in findings.ORACLES
    assert evaluate(shared_prefix_scenario(), "fixed", efficiency=False).verdict.clean
    with pytest.raises(corpus.CaseError, match="to one of clean, slot_hash"):
        corpus.parse_case(corpus.case_json(shared_prefix_scenario(), {"fixed": KIND}), "x.json")
    with pytest.raises(export.ExportError, match="no scheduler-side assertion"):
        export.check_for(f"{KIND}:two-or-more")


def test_a_registered_kind_is_a_verdict_an_expected_table_may_name(crowd_oracle):
    text = corpus.case_json(shared_prefix_scenario(), {"fixed": KIND},
                            expected_by_vllm={"0.1": {"fixed": KIND}})
    assert corpus.parse_case(text, "x.json").expected["fixed"] == KIND
    assert KIND in findings.verdict_kinds()


def test_the_exporter_reads_a_registered_kinds_assertion(crowd_oracle):
    assert export.check_for(f"{KIND}:two-or-more") == findings.NO_CRASH
    assert export.check_for("slot_hash:short/chunk-end") == findings.PUBLISHED_STATE_WRITTEN  # built-ins unchanged


def test_triage_files_a_registered_kind(crowd_oracle, tmp_path):
    scenario = shared_prefix_scenario()
    violation = oracle_judge("fixed").verdict(scenario)
    triage = Triage(FindingStore(tmp_path), "fixed", known=set(), minimize_budget=2, announce=False)
    filed = triage.handle(scenario, violation, {"engine": "test"})
    assert filed is not None and not filed.flaky and filed.signature == f"{KIND}:two-or-more"
    meta = json.loads(filed.path.read_text())["finding"]
    assert meta["kind"] == KIND and meta["reproduced"] == "3/3"
    assert triage.handle(scenario, violation, {}) is None and triage.duplicates == 1


def test_a_report_only_kind_is_reported_never_judged_failing(tmp_path):
    findings.register(findings.Oracle(REPORT_KIND, fails=False, check=f"{__name__}:check_crowd_report"))
    try:
        verdict = evaluate(shared_prefix_scenario(), "fixed", efficiency=False).verdict
        assert verdict.clean and [f.kind for f in verdict.reports] == [REPORT_KIND]
        assert REPORT_KIND not in findings.verdict_kinds()
    finally:
        del findings.ORACLES[REPORT_KIND]


def test_a_kind_registers_once():
    with pytest.raises(ValueError):
        findings.register(findings.Oracle("slot_hash"))
    with pytest.raises(ValueError):
        findings.register(findings.Oracle(findings.CLEAN))


def test_a_stall_exports_every_request_finishing_within_the_bound():
    assert export.check_for("stall:step-bound") == findings.EVERY_REQUEST_FINISHES
    for location in ("wall-clock", "nocache-step-bound"):  # the harness's clock; a scheduler without caching
        with pytest.raises(export.ExportError, match="no scheduler-side assertion"):
            export.check_for(f"stall:{location}")


def _divergence(request_id):
    return findings.OutputDivergence(f"{request_id}: output token 0 differs", "tokens", request_id=request_id)


def _stall(*unfinished):
    return findings.Stall("did not finish", "step-bound", 325, unfinished[0], unfinished=unfinished)


def test_a_divergence_of_a_stalled_request_is_exported_as_the_stall():
    # the judge compares outputs only when the run with prefix caching off finished: a divergent
    # request that the cached run left unfinished diverges because it stalled
    stall = _stall("r1", "r0")
    assert findings.exported_finding([_divergence("r0"), stall]) is stall


def test_a_divergence_of_a_request_that_finished_is_exported_as_itself():
    divergence = _divergence("r1")
    assert findings.exported_finding([divergence, _stall("r0")]) is divergence
    assert findings.exported_finding([divergence]) is divergence
    assert findings.exported_finding([]) is None


def test_only_a_kind_the_oracle_names_is_a_cause():
    crash = findings.VllmCrash("boom", "ValueError@x", request_id="r0")
    assert findings.exported_finding([_divergence("r0"), crash]) is not crash


def test_every_shipped_kind_is_reported_through_a_registered_check():
    """The shipped oracles go through the registry as a plug-in does: each kind has a check, or is
    one its oracle's check declares it also reports; only the two kinds judged against another run's
    figures (a reference split, the PR's base) have none."""
    reported = {kind for o in findings.ORACLES.values() if o.check for kind in (o.kind, *o.also_reports)}
    assert set(findings.ORACLES) - reported == {"efficiency", "efficiency_regression"}


def test_a_shipped_check_left_out_of_the_registry_reports_nothing(monkeypatch):
    """The judge holds no list of its own: the slot_hash oracle registered without its check
    leaves the first-chunk case with no wrong-state finding at all."""
    from dataclasses import replace

    from tests.conftest import first_chunk_scenario

    def kinds():
        return {f.kind for f in evaluate(first_chunk_scenario(), "prefix", efficiency=False).verdict.findings}

    assert "slot_hash" in kinds()
    monkeypatch.setitem(findings.ORACLES, "slot_hash", replace(findings.ORACLES["slot_hash"], check=None))
    assert not kinds() & {"slot_hash", "resume_state", "stale_read", "uninit_read", "nocache_stale_read"}


def test_a_check_reporting_a_kind_its_oracle_does_not_declare_is_refused():
    findings.register(findings.Oracle(KIND, check=f"{__name__}:check_crowd_report"))
    try:
        with pytest.raises(ValueError, match=f"oracle {KIND}'s check .* reported a {REPORT_KIND} finding"):
            evaluate(shared_prefix_scenario(), "fixed", efficiency=False)
    finally:
        del findings.ORACLES[KIND]
