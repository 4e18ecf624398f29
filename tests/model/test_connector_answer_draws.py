"""The generator's draw of the connector's answers (mambafuzz.model.generate `_draw_connector_answers`):
drawn last, only where a connector is attached, and changing no other field; the minimizer shrinks it."""

from __future__ import annotations

import dataclasses
import random

from mambafuzz.model import generate
from mambafuzz.model.scenario import validate
from mambafuzz.search import minimizer
from tests.conftest import drawn_with_and_without


def _with_and_without(seeds):
    return drawn_with_and_without("_draw_connector_answers", seeds)


def _without_answers(s):
    s = dataclasses.replace(s, engine=dataclasses.replace(s.engine, connector_failed_sync_load=0),
                            requests=[dataclasses.replace(r, connector_defer=0) for r in s.requests])
    return s


def test_the_answers_are_a_late_draw_only_with_a_connector_and_change_nothing_else():
    drawn, before = _with_and_without(range(600))
    deferring = 0
    for s, b in zip(drawn, before):
        assert not validate(s)
        assert _without_answers(s) == b
        if s == b:
            continue
        assert b.uses_connector, "an answer drawn where no connector is attached"
        deferring += any(r.connector_defer for r in s.requests)
        assert not s.engine.connector_failed_sync_load  # never drawn (see _draw_connector_answers)
    with_connector = sum(b.uses_connector for b in before)
    assert with_connector * 0.2 <= deferring <= with_connector * 0.45, (deferring, with_connector)


def test_the_minimizer_shrinks_a_deferral():
    s = next(s for s in (generate.random_scenario(random.Random(seed)) for seed in range(600))
             if any(r.connector_defer for r in s.requests))
    fields = [(name, value, simplest) for _, name, value, simplest in minimizer._int_fields(s)]
    deferred = sorted(r.connector_defer for r in s.requests if r.connector_defer)
    assert sorted(v for name, v, simplest in fields if name == "connector_defer" and simplest == 0) == deferred


def test_a_generated_deferral_shows_each_planted_deferral_bug():
    """Seed 5 of the random generator draws five requests, three of them deferred by the connector:
    each planted deferral bug fails it (attributed: clean on unmodified vLLM). With the deferrals left
    out, the same seed is clean with each bug planted. (Seed 18 before the decode-pressure draw
    was added ahead of this one.)"""
    from mambafuzz.tools.mutation import kills

    drawn, before = _with_and_without([5])
    assert any(r.connector_defer for r in drawn[0].requests)
    for mutant, signature in (("defer_not_requeued", "stall:step-bound"),
                              ("defer_taken_as_miss", "vllm_crash:SchedulerContract@scheduler-output"),
                              ("defer_not_skipped", "vllm_crash:SchedulerContract@scheduler-output")):
        ok, why = kills.confirms_kill(drawn[0], "fixed", mutant, signature=signature)
        assert ok, (mutant, why)
        ok, why = kills.confirms_kill(before[0], "fixed", mutant)
        assert not ok, (mutant, why)
