"""Bug identity: a finding is a known bug only when that bug's fix explains it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mambafuzz.checks import attribution
from mambafuzz.checks.pipeline import evaluate
from mambafuzz.findings import Violation
from mambafuzz.model.scenario import with_runner
from mambafuzz.search.triage import Triage, known_signatures
from mambafuzz.sim import patching
from mambafuzz.store import corpus
from mambafuzz.store.finding_store import FindingStore
from mambafuzz.upstream.export import finding_runner

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "corpus" / "upstream"
KNOWN = [ROOT / "corpus" / "regressions", UPSTREAM]
MIDBLOCK = UPSTREAM / "internal_checkpoint_midblock_resume"
PLANTED = "mambafuzz.tools.mutation.planted:realign_one_block_late_split"


def collision_scenario():
    """A checkpoint engine, a resume at 112 from connector tokens, and a prompt long enough
    that the first chunk is not final: vLLM grants no checkpoint exemption, so its split stops
    at 256 and the run is clean; the planted split stops one block late and poisons slot 0."""
    case = corpus.load_case(MIDBLOCK / "internal_checkpoint_midblock_resume_connector.json")
    req = dataclasses.replace(case.scenario.requests[0], unique_len=2000)
    return dataclasses.replace(case.scenario, requests=[req])


def test_planted_split_bug_with_a_known_signature_is_new(tmp_path):
    scenario = collision_scenario()
    assert evaluate(scenario, "fixed", efficiency=False).verdict.clean
    v = evaluate(scenario, PLANTED, efficiency=False).verdict
    known = known_signatures(KNOWN, PLANTED)
    sig = v.primary.signature
    assert sig in {s for b in known.bugs for s in b.signatures}, "the test needs a colliding signature"
    triage = Triage(FindingStore(tmp_path / "findings"), PLANTED, known=known, minimize_budget=5, announce=False)
    filed = triage.handle(scenario, Violation(sig, v.primary.message), {"engine": "test"})
    assert filed is not None and triage.duplicates == 0
    meta = corpus.load_case(filed.path).extra["finding"]
    assert meta["attribution"]["closest"] == MIDBLOCK.name and meta["attribution"]["new"]


def test_signature_only_store_would_have_hidden_it(tmp_path):
    """The old behaviour, kept for callers that pass plain signatures: a duplicate."""
    scenario = collision_scenario()
    v = evaluate(scenario, PLANTED, efficiency=False).verdict
    triage = Triage(FindingStore(tmp_path / "f"), PLANTED, known={v.primary.signature}, announce=False)
    assert triage.handle(scenario, Violation(v.primary.signature), {}) is None and triage.duplicates == 1


@pytest.mark.parametrize("path", sorted(p for p in UPSTREAM.rglob("*.json") if (p.parent / "fix.py").is_file()),
                         ids=lambda p: p.name)
def test_upstream_case_is_attributed_to_its_own_bug(path):
    """On the model runner it was filed on (a V1 worker bug is clean on V2)."""
    case = corpus.load_case(path)
    scenario = with_runner(case.scenario, finding_runner(case))
    bugs = attribution.known_bugs_for(KNOWN, "fixed")
    v = evaluate(scenario, "fixed", efficiency=False).verdict
    att = attribution.attribute(scenario, "fixed", v.primary.signature, bugs)
    assert [b.name for b in att.known][:1] == [path.parent.name], att.reason


def test_known_bug_in_store_is_a_duplicate(tmp_path):
    case = corpus.load_case(MIDBLOCK / "internal_checkpoint_poison_read_back.json")
    v = evaluate(case.scenario, "fixed", efficiency=False).verdict
    triage = Triage(FindingStore(tmp_path / "f"), "fixed", known=known_signatures(KNOWN, "fixed"), announce=False)
    assert triage.handle(case.scenario, Violation(v.primary.signature), {}) is None
    assert triage.attributed == {MIDBLOCK.name: 1}


def test_fix_that_no_longer_applies_is_named_and_falls_back_to_its_cases(tmp_path):
    bug = attribution.load_known_bugs([UPSTREAM], "fixed")[0]
    broken = dataclasses.replace(bug, patches=[patching.Rewrite(bug.patches[0].target, (("no such line", "x"),))]
                                 if isinstance(bug.patches[0], patching.Rewrite) else
                                 [patching.Wrap("vllm.v1.core.sched.scheduler:Scheduler.no_such_method", lambda f: f)])
    broken.fix_error = patching.check_applies(broken.patches)
    assert broken.fix_error and ("not found" in broken.fix_error or "occurs 0 times" in broken.fix_error)
    case = bug.cases[0]
    sig = evaluate(case.scenario, "fixed", efficiency=False).verdict.primary.signature
    att = attribution.attribute(case.scenario, "fixed", sig, [broken])
    assert not att.is_new and "no longer applies" in att.reason


def test_regression_is_explained_by_the_installed_split():
    path = next((ROOT / "corpus" / "regressions").glob("*.json"))
    case = corpus.load_case(path)
    split = next(s for s, k in case.expected.items() if k != "clean")
    v = evaluate(case.scenario, split, efficiency=False).verdict
    att = attribution.attribute(case.scenario, split, v.primary.signature, attribution.known_bugs_for(KNOWN, split))
    assert not att.is_new, att.reason


def test_patches_are_restored():
    bugs = attribution.load_known_bugs([UPSTREAM], "fixed")
    targets = {p.target: patching.resolve_target(p.target) for b in bugs for p in b.patches}
    before = {t: vars(owner).get(attr) for t, (owner, attr) in targets.items()}
    for bug in bugs:
        with patching.applied(bug.patches):
            for p in bug.patches:
                owner, attr = targets[p.target]
                assert vars(owner).get(attr) is not before[p.target]
    assert {t: vars(owner).get(attr) for t, (owner, attr) in targets.items()} == before
    assert not patching.split_wraps


def test_a_campaign_dedups_by_fine_signature(tmp_path):
    """Within a campaign the fine signature is the first key: the same coarse signature with
    another mechanism is not a duplicate; the same fine signature is."""
    scenario = collision_scenario()
    triage = Triage(FindingStore(tmp_path / "f"), "fixed", known=set(), announce=False)
    triage.new_signatures.add("slot_hash:short/chunk-end|token-budget,fresh,chunk-end")
    coarse = "slot_hash:short/chunk-end"
    assert triage.is_duplicate(scenario, Violation(coarse, "", coarse + "|token-budget,fresh,chunk-end")) is not None
    assert triage.is_duplicate(scenario, Violation(coarse, "", coarse + "|long-prefill,fresh,chunk-end")) is None


def test_two_known_bugs_of_different_kinds_in_one_scenario_are_both_named():
    """The mutation bench's control filed this as new on unmodified vLLM: no single fix makes it
    clean (each leaves the other bug), and only same-kind fixes were tried together."""
    scenario = corpus.load_case(ROOT / "tests" / "data" / "two_known_bugs_in_one_scenario.json").scenario
    bugs = attribution.known_bugs_for(KNOWN, "fixed")
    v = evaluate(scenario, "fixed", efficiency=False).verdict
    assert v.primary.signature == "slot_hash:short/connector+ckpt"
    assert not any(attribution.clean_under(scenario, "fixed", (b,)) for b in bugs if b.has_usable_fix)
    att = attribution.attribute(scenario, "fixed", v.primary.signature, bugs)
    assert sorted(b.name for b in att.known) == ["internal_checkpoint_midblock_resume",
                                                 "spec_pad_one_token_prompt_unzeroed_block"], att.reason


def test_the_connector_admission_fix_admits_what_unmodified_vllm_admits():
    """Its first version added the external allocation to an estimate that already covered it,
    so this async-connector request never fitted the 25-block pool (found by a --with-known-fixes
    campaign): a stall that unmodified vLLM does not have."""
    scenario = corpus.load_case(ROOT / "tests" / "data" / "connector_fix_overcounts_async_load.json").scenario
    assert evaluate(scenario, "fixed", efficiency=False).verdict.clean
    fix = [b for b in attribution.known_bugs_for(KNOWN, "fixed")
           if b.name == "connector_admission_estimate_short_per_mamba_group"]
    assert attribution.clean_under(scenario, "fixed", fix)


def test_pr_mode_files_what_its_base_does_not_show_even_where_a_known_fix_explains_it(tmp_path):
    """The PR's vLLM (here: the hash-grid split bug planted in this process) against its base (the
    installed vLLM, in the base process). A known fix also makes the planted bug's case clean, so
    attribution by fix dropped it as known; against the base it is new. An upstream case the base
    shows too is recorded as pre-existing, labelled by its fix, and is not new."""
    from mambafuzz.checks.pipeline import signature_of
    from mambafuzz.search.pr.against_base import AgainstBase
    from mambafuzz.search.pr.base_process import BaseProcess
    from mambafuzz.tools.mutation import planting

    planted = corpus.load_case(ROOT / "tests" / "data" / "split_hash_grid_clean_under_a_known_fix.json").scenario
    upstream = corpus.load_case(MIDBLOCK / "internal_checkpoint_poison_read_back.json").scenario
    known = known_signatures(KNOWN, "fixed")
    base = BaseProcess("installed", "fixed")
    pr = Triage(FindingStore(tmp_path / "pr"), "fixed", known=known, minimize_budget=5, announce=False)
    pr.base = AgainstBase(base.signature_of, "installed")
    by_fix = Triage(FindingStore(tmp_path / "by-fix"), "fixed", known=known, minimize_budget=5, announce=False)
    try:
        with patching.applied(planting.patches("split_hash_grid")):
            sig = signature_of(planted, "fixed")
            assert sig == "slot_hash:short/chunk-end+ckpt"
            assert by_fix.handle(planted, Violation(sig, "planted"), {}) is None  # a known fix explains it
            filed = pr.handle(planted, Violation(sig, "planted"), {})
            pre = pr.handle(upstream, Violation(signature_of(upstream, "fixed"), "upstream"), {})
    finally:
        base.close()
    meta = corpus.load_case(filed.path).extra["finding"]
    assert not filed.pre_existing and meta["base"] == {"where": "installed", "signature": None}
    assert meta["attribution"]["known"] == ["internal_checkpoint_midblock_resume"]  # a label only
    assert pre.pre_existing and pre.path.parent.name == "pre-existing" and pr.filed == [filed]
    assert corpus.load_case(pre.path).extra["finding"]["attribution"]["known"] == ["internal_checkpoint_midblock_resume"]


PP_STALL = ROOT / "corpus" / "untriaged" / "mtp_async_two_request_stall_near_min_pool.json"
IN_FLIGHT = "async_inflight_state_block_beyond_startup_reserve"


def test_a_fix_that_raises_the_startup_minimum_is_judged_on_the_pool_the_fixed_engine_accepts():
    """Finding 6's fix reserves the state columns of the batches in flight, so the fixed start-up
    check asks 67 blocks for this PP=4 MTP case and refuses its 65-block pool: an engine with the
    fix never runs it there. Replayed on 67 blocks under the fix it is clean, so the stall is
    finding 6's; with no fix it still stalls (the raised pool comes only from a fix)."""
    case = corpus.load_case(PP_STALL)
    bugs = attribution.known_bugs_for(KNOWN, "fixed")
    in_flight = [b for b in bugs if b.name == IN_FLIGHT]
    assert in_flight and case.scenario.engine.num_gpu_blocks == 65
    assert not attribution.clean_under(case.scenario, "fixed", ())
    fixed = evaluate(case.scenario, "fixed", efficiency=False, patches=in_flight[0].patches)
    assert attribution.pool_floor_raised_by_fix(case.scenario, fixed.trace) == 67
    assert attribution.clean_under(case.scenario, "fixed", in_flight)
