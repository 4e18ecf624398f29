"""Hypothesis properties over the shared input model (`mambafuzz.model.generate.scenarios`).

Profiles: `ci` (default, small and bounded) and `long`; choose with HYPOTHESIS_PROFILE=long.
"""

import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mambafuzz.checks import attribution
from mambafuzz.checks.pipeline import evaluate
from mambafuzz.model.generate import scenario_from_bytes, scenarios
from mambafuzz.model.scenario import ScenarioError, loads, validate
from mambafuzz.search.triage import known_signatures
from mambafuzz.sim.engine import harness, splits
from mambafuzz.store.known_bugs import untriaged_candidates

# `ci` is derandomized: the same 25 examples every run, so the suite cannot flake.
settings.register_profile("ci", max_examples=25, deadline=None, database=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.register_profile("long", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@given(scenarios())
def test_generated_scenarios_round_trip_through_json(s):
    if validate(s):
        return
    assert loads(s.dumps()) == s


@given(st.binary(max_size=256))
def test_any_bytes_decode_to_a_scenario(data):
    s = scenario_from_bytes(data)
    assert s.requests
    assert isinstance(validate(s), list)


CORPUS = Path(__file__).resolve().parents[2] / "corpus"
KNOWN_UPSTREAM = known_signatures([CORPUS / "upstream"], "fixed")
UNTRIAGED = untriaged_candidates([CORPUS / "untriaged"])


@given(scenarios())
def test_installed_vllm_keeps_the_invariant(s):
    """The fuzzing property itself: on the installed split, nothing the oracles check fails,
    apart from the triaged behaviours of corpus/upstream and the open candidates already filed in
    corpus/untriaged (a finding one of their candidate fixes removes: labelled, as a campaign labels
    it, not claimed; anything else fails here)."""
    if validate(s):
        return
    try:
        v = evaluate(s, "fixed", efficiency=False).verdict
    except ScenarioError:
        return
    if v.clean:
        return
    # Triaged means explained by a known upstream fix (mambafuzz.checks.attribution), not just a look-alike signature.
    att = attribution.attribute(s, "fixed", v.primary.signature, KNOWN_UPSTREAM.bugs)
    if att.is_new and attribution.untriaged_explanation(s, "fixed", v.primary.signature, UNTRIAGED,
                                                        KNOWN_UPSTREAM.bugs):
        return
    assert not att.is_new, f"{v.primary.message} ({att.reason})\n{s.dumps()}"


@given(scenarios())
def test_restated_split_schedules_like_the_installed_one(s):
    if validate(s):
        return
    try:
        a = harness.run(s, None, "fixed")
        b = harness.run(s, splits.restated_fixed_split, "restated")
    except ScenarioError:
        return
    assert [[(c.request_id, c.start, c.num_tokens) for c in r.chunks] for r in a.steps] == \
           [[(c.request_id, c.start, c.num_tokens) for c in r.chunks] for r in b.steps]
