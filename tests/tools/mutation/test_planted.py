"""Planted bugs are reversible, each applies to the installed vLLM, and a kill is confirmed only
by a scenario that fails with the mutant and is clean without it."""

from pathlib import Path

import pytest

from mambafuzz.sim import patching
from mambafuzz.store import corpus
from mambafuzz.tools.mutation import kills, planted, planting

ROOT = Path(__file__).resolve().parents[3]
SEEDS = ROOT / "corpus" / "seeds"


@pytest.mark.parametrize("name", sorted(planted.MUTANTS))
def test_mutant_applies_and_is_restored(name):
    assert patching.check_applies(planting.patches(name)) is None


def test_kill_needs_the_mutant_and_a_clean_baseline():
    case = corpus.load_case(SEEDS / "preemption_small_pool_mtp.json")
    ok, why = kills.confirms_kill(case.scenario, "fixed", "admission_estimate_one_short")
    assert ok, why
    ok, why = kills.confirms_kill(case.scenario, "fixed", "admission_estimate_one_short", signature="stall:x")
    assert not ok and "not stall:x" in why
    upstream = corpus.load_case(next((ROOT / "corpus" / "upstream").rglob("*poison_read_back.json")))
    ok, why = kills.confirms_kill(upstream.scenario, "fixed", "admission_estimate_one_short")
    assert not ok and "without the mutant too" in why


def test_enough_mutants_outside_the_split():
    outside = [n for n in planted.MUTANTS if not n.startswith(("split_", "manager_"))]
    assert len(outside) >= 8


def test_a_row_scheduled_past_its_tokens_is_a_finding_not_a_tool_failure():
    """Without the rollback of rejected drafts vLLM schedules a row past its request's tokens; no
    worker can run that, so it is filed (located at the scheduler's output) instead of stopping
    the campaign as a harness failure."""
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.store import corpus

    case = corpus.load_case(ROOT / "tests" / "data" / "spec_no_rollback_schedules_past_tokens.json")
    with_bug = evaluate(case.scenario, "fixed", efficiency=False, patches=planting.patches("spec_no_rollback")).verdict
    assert with_bug.primary.fine_signature == "vllm_crash:SchedulerContract@scheduler-output|row-within-tokens", \
        with_bug.primary.message
    assert evaluate(case.scenario, "fixed", efficiency=False).verdict.clean


def test_a_row_of_drafts_alone_is_a_contract_finding_not_a_tool_failure():
    """Half a rollback of rejected drafts leaves a request computed up to its last token, and vLLM
    schedules a row of drafts with no token of its own to verify them: the harness used to index
    past the row's outputs (IndexError in `_accept`, a tool failure that stopped the worker)."""
    from mambafuzz.checks.pipeline import evaluate

    case = corpus.load_case(ROOT / "tests" / "data" / "spec_half_rollback_drafts_without_a_token.json")
    with_bug = evaluate(case.scenario, "fixed", efficiency=False, patches=planting.patches("spec_half_rollback")).verdict
    assert with_bug.primary.fine_signature == "vllm_crash:SchedulerContract@scheduler-output|row-verifies-drafts", \
        with_bug.primary.message
    assert "no token of its own" in with_bug.primary.message
    assert evaluate(case.scenario, "fixed", efficiency=False).verdict.clean
