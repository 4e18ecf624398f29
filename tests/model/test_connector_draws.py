"""The generator draws the KV connector's behaviour (saves, multi-step and failing async loads,
divergent hits, loads of saved states) where requests claim connector tokens, and only there."""

from __future__ import annotations

import random

from mambafuzz.model.generate import CONNECTOR_KNOBS, UNDRAWN_CONNECTOR_KNOBS, random_scenario
from mambafuzz.model.scenario import EngineConfig, knobs, validate


def test_connector_behaviour_is_drawn_only_where_a_connector_is_used_and_stays_valid():
    drawn = [random_scenario(random.Random(seed)) for seed in range(400)]
    defaults = {name: getattr(EngineConfig(), name) for name in CONNECTOR_KNOBS}
    changed = [s for s in drawn if any(getattr(s.engine, n) != v for n, v in defaults.items())]
    assert all(any(r.external_tokens for r in s.requests) for s in changed)
    assert all(not validate(s) for s in changed)
    for name in CONNECTOR_KNOBS:  # every knob takes a non-default value somewhere
        assert any(getattr(s.engine, name) != defaults[name] for s in changed), name
    # loads of saved states follow the scheduler's boundary-state hand-offs, and are drawn beside saves
    assert any(s.engine.connector_load_source == "saved" and s.engine.connector_save for s in drawn)
    assert set(CONNECTOR_KNOBS) | set(UNDRAWN_CONNECTOR_KNOBS) == {n for n in knobs() if n.startswith("connector_")}
    assert not any(getattr(s.engine, n) != getattr(EngineConfig(), n) for s in drawn for n in UNDRAWN_CONNECTOR_KNOBS)
