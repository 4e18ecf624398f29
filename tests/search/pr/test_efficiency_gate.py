"""PR mode's efficiency gate (mambafuzz/search/pr/efficiency_gate.py): an input on which the PR's vLLM
does more work than its base is a finding, with both sides' figures; an allowed figure is not."""

import sys
from pathlib import Path

import pytest

from mambafuzz.cli.main import main
from mambafuzz.search.pr import efficiency_gate
from mambafuzz.search.pr.base_process import BaseProcess
from mambafuzz.sim import patching
from mambafuzz.tools.mutation import planting

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "checks"))
from test_resources import RESEND  # noqa: E402  a resend whose hit a planted bug takes away


def test_regression_names_each_worse_figure_in_a_fixed_order():
    base = {"hits": 192, "steps": 6, "blocks": 20}
    assert efficiency_gate.regression(dict(base), base) is None
    assert efficiency_gate.regression({"hits": 200, "steps": 5, "blocks": 19}, base) is None  # better is fine
    v = efficiency_gate.regression({"hits": 0, "steps": 8, "blocks": 21}, base)
    assert v.signature == "efficiency_regression:hits+steps+blocks"
    assert "prefix-hit tokens served 0 here vs 192 on the base" in v.message
    assert v.gap == 192 + 2 + 1  # how far past the base, summed over the worse figures
    allowed = efficiency_gate.check_allowed(["steps"])
    assert efficiency_gate.regression({"hits": 0, "steps": 8, "blocks": 20}, base, allowed).signature \
        == "efficiency_regression:hits"
    with pytest.raises(ValueError, match="unknown efficiency figure"):
        efficiency_gate.check_allowed(["latency"])


class _FixedBase:
    """A base that answers the figures it was given (the subprocess is tested below)."""

    where = "test-base"

    def __init__(self, answer):
        self.answer, self.asked = answer, 0

    def figures_begin(self, scenario):
        self.asked += 1

    def figures_end(self):
        return self.answer


def test_the_gated_judge_finds_a_planted_resource_bug_its_base_does_not_have():
    unmodified = efficiency_gate.figures_of(RESEND, "fixed")
    base = _FixedBase(unmodified)
    judge = efficiency_gate.gated_judge("fixed", base)
    assert judge.verdict(RESEND) is None  # the same vLLM on both sides
    better = efficiency_gate.gated_judge("fixed", _FixedBase({**unmodified, "hits": unmodified["hits"] + 16}))
    v = better.verdict(RESEND)  # a base that served more: the states are right, the work is not
    assert v.signature == "efficiency_regression:hits" and f"{unmodified['hits']} here" in v.message
    assert better.repro(Path("case.json"), v.signature).endswith("--base test-base")
    assert efficiency_gate.gated_judge("fixed", _FixedBase(None)).verdict(RESEND) is None  # base cannot run it
    with patching.applied(planting.patches("resource_prompt_checkpoint_evicted")):
        v = judge.verdict(RESEND)
    # the oracles' own finding comes first; the gate judges only what they pass
    assert v.signature == "missed_hit:below-prompt-checkpoint"
    with patching.applied(planting.patches("resource_prompt_checkpoint_evicted")):
        figures = efficiency_gate.figures_of(RESEND, "fixed")
    assert figures["hits"] < unmodified["hits"] and figures["steps"] > unmodified["steps"]
    assert efficiency_gate.regression(figures, unmodified).signature == "efficiency_regression:hits+steps"
    assert base.asked == 2


def test_the_base_process_answers_the_figures_this_process_computes():
    base = BaseProcess("installed", "fixed")
    try:
        base.figures_begin(RESEND)
        assert base.figures_end() == efficiency_gate.figures_of(RESEND, "fixed")
    finally:
        base.close()


def test_allow_efficiency_needs_a_base(capsys):
    assert main(["fuzz", "--allow-efficiency", "hits", "--max-time", "1"]) == 2
    err = capsys.readouterr().err
    assert "--allow-efficiency" in err and len(err.strip().splitlines()) == 1


def test_a_gate_kill_is_confirmed_by_replaying_both_sides():
    """bench/mutation_run.py and bench/mutation_score.py --base (efficiency_gate.confirms_finding): an
    efficiency_regression kills a mutant only when replaying the case with and without it gives
    exactly the filed figures; any other signature goes to the oracles' replay."""
    from mambafuzz.search.pr.efficiency_gate import confirms_finding
    from mambafuzz.tools.mutation import kills

    ok, why = confirms_finding(RESEND, "resource_prompt_checkpoint_evicted", "efficiency_regression:hits+steps")
    assert ok and "here vs" in why
    ok, why = confirms_finding(RESEND, "resource_prompt_checkpoint_evicted", "efficiency_regression:blocks")
    assert not ok and "filed efficiency_regression:blocks" in why
    ok, why = confirms_finding(RESEND, "resource_prompt_checkpoint_evicted", "slot_hash:short/chunk-end")
    assert not ok and why == kills.confirms_kill(RESEND, "fixed", "resource_prompt_checkpoint_evicted",
                                                 "slot_hash:short/chunk-end")[1]


def test_the_base_process_judges_as_the_conform_target_when_asked():
    """PR mode for the conform target: the base answers a scenario's first disagreement between
    the kernel model and its vLLM's worker code, as this process computes it."""
    from mambafuzz.conform import target as conform_target
    from mambafuzz.model.scenario import loads

    # the oracles find a capacity behaviour of vLLM 0.32 here; the worker code agrees with the kernel model
    case = Path(__file__).resolve().parents[3] / "corpus/upstream/async_inflight_state_block_beyond_startup_reserve"
    s = loads((case / "async_inflight_state_block_beyond_startup_reserve.json").read_text())
    mine = conform_target.verdict(s, ["v1"])
    base = BaseProcess("installed", "fixed", conform_runners=["v1"])
    try:
        assert base.signature_of(s) == (None if mine is None else mine.signature)
    finally:
        base.close()
    scheduler_base = BaseProcess("installed", "fixed")
    try:
        assert scheduler_base.signature_of(s).startswith("capacity:")
    finally:
        scheduler_base.close()
