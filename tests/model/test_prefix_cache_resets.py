"""The engine's `reset_prefix_cache` as an input event: `Scenario.prefix_cache_resets` is drawn last by the
generator, left out of files without it, validated one line per problem (the combination vLLM 0.32 raises
on refused), and dropped by the minimizer."""

from __future__ import annotations

import json
import random

import pytest

from mambafuzz.model import generate
from mambafuzz.model.scenario import (
    EngineConfig,
    PrefixCacheReset,
    RequestSpec,
    Scenario,
    ScenarioError,
    from_json,
    loads,
    validate,
)
from mambafuzz.search import minimizer


def _two(*resets: PrefixCacheReset, external: int = 0) -> Scenario:
    return Scenario(EngineConfig(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=64, async_scheduling=False),
                    prefixes=[200], requests=[RequestSpec(0, [0], 20, 6, external_tokens=external),
                                              RequestSpec(2, [0], 30, 6)],
                    prefix_cache_resets=list(resets))


def test_resets_are_the_generators_last_draw():
    """Clearing the resets gives exactly the scenario the same input gave before the event; about an eighth
    of the multi-request scenarios get one or two, in step order, never preempting beside a connector."""
    later = generate._draw_prefix_cache_resets
    try:
        drawn = [generate.random_scenario(random.Random(seed)) for seed in range(400)]
        generate._draw_prefix_cache_resets = lambda src, scenario: None
        before = [generate.random_scenario(random.Random(seed)) for seed in range(400)]
    finally:
        generate._draw_prefix_cache_resets = later
    with_resets = [s for s in drawn if s.prefix_cache_resets]
    assert 20 <= len(with_resets) <= 80
    assert all(len(s.requests) > 1 and not validate(s) for s in with_resets)
    assert any(r.reset_running_requests for s in with_resets for r in s.prefix_cache_resets)
    assert not any(r.reset_running_requests and s.uses_connector for s in with_resets for r in s.prefix_cache_resets)
    for s, b in zip(drawn, before):
        s.prefix_cache_resets = []
        assert s == b


def test_files_without_resets_round_trip_unchanged_and_with_them_keep_them():
    assert "prefix_cache_resets" not in _two().to_json()
    s = _two(PrefixCacheReset(3, True), PrefixCacheReset(9))
    raw = s.to_json()
    assert raw["prefix_cache_resets"] == [{"step": 3, "reset_running_requests": True},
                                          {"step": 9, "reset_running_requests": False}]
    assert loads(s.dumps()) == s


@pytest.mark.parametrize("resets, problem", [
    ("no", "prefix_cache_resets must be a list of {step, reset_running_requests} objects"),
    ([5], "prefix_cache_resets[0] must be an object, got int"),
    ([{"step": "x"}], "prefix_cache_resets[0].step must be an integer, got 'x'"),
    ([{"step": -1}], "prefix_cache_resets[0].step must be in [0, "),
    ([{"step": 2, "reset_running_requests": 1}], "prefix_cache_resets[0].reset_running_requests must be true or false"),
    ([{"step": 2}, {"step": 2}], "prefix_cache_resets[1].step 2 must come after the previous reset's step 2"),
    ([{"step": 2, "when": 1}], "prefix_cache_resets[0].when is not a known field"),
])
def test_bad_values_are_one_line_each(resets, problem):
    raw = _two().to_json()
    raw["prefix_cache_resets"] = resets
    with pytest.raises(ScenarioError) as exc:
        from_json(json.loads(json.dumps(raw)))
    assert any(p.startswith(problem) for p in exc.value.problems), exc.value.problems
    assert all("\n" not in p for p in exc.value.problems)


def test_preempting_reset_beside_a_connector_is_refused():
    """vLLM 0.32 raises RuntimeError instead of resetting when a connector still holds blocks after the
    preemption (scheduler.py:2868-2874): one line, and only for the preempting form."""
    assert validate(_two(PrefixCacheReset(3, True), external=100)) == [
        "prefix_cache_resets[0].reset_running_requests needs a scenario without a KV connector: vLLM 0.32 raises "
        "when a connector still holds blocks after the preemption (Scheduler.reset_prefix_cache)"]
    assert not validate(_two(PrefixCacheReset(3, False), external=100))


def test_a_preempting_reset_lengthens_the_liveness_bound():
    """A reset that preempts may make every running request compute all it computed again; a reset after the
    last arrival moves the bound by its step, as an arrival would."""
    plain, keeps, preempts, late = _two(), _two(PrefixCacheReset(1)), _two(PrefixCacheReset(1, True)), _two(PrefixCacheReset(5))
    tokens = plain.size()[2]
    assert keeps.liveness_bound() == plain.liveness_bound()
    assert preempts.liveness_bound() == plain.liveness_bound() + tokens
    assert late.liveness_bound() == plain.liveness_bound() + 3


def test_the_minimizer_drops_resets_and_stops_them_preempting():
    s = _two(PrefixCacheReset(3, True), PrefixCacheReset(9))
    assert minimizer._drop_resets in minimizer.PASSES
    candidates = list(minimizer._drop_resets(s))
    assert [c.prefix_cache_resets for c in candidates] == [
        [PrefixCacheReset(3, True)], [PrefixCacheReset(9)], [PrefixCacheReset(3), PrefixCacheReset(9)]]
    assert all(minimizer.complexity(c) < minimizer.complexity(s) for c in candidates)
    assert any(c.prefix_cache_resets[1].step == 4 for c in minimizer._shrink_numbers(s))
