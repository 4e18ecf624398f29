"""The generator draws the KV connector's behaviour (saves, multi-step and failing async loads,
divergent hits) where requests claim connector tokens, and only there; never loads of saved states."""

from __future__ import annotations

import random

from mambafuzz.model.generate import CONNECTOR_KNOBS, random_scenario
from mambafuzz.model.scenario import EngineConfig, knobs, validate


def test_connector_behaviour_is_drawn_only_where_a_connector_is_used_and_stays_valid():
    drawn = [random_scenario(random.Random(seed)) for seed in range(400)]
    defaults = {name: getattr(EngineConfig(), name) for name in CONNECTOR_KNOBS}
    changed = [s for s in drawn if any(getattr(s.engine, n) != v for n, v in defaults.items())]
    assert all(any(r.external_tokens for r in s.requests) for s in changed)
    assert all(not validate(s) for s in changed)
    for name in CONNECTOR_KNOBS:  # every knob takes a non-default value somewhere, but the load source
        if name != "connector_load_source":
            assert any(getattr(s.engine, name) != defaults[name] for s in changed), name
    # loads of saved states rest on a positional save vLLM's connectors do not make for mamba blocks
    assert all(s.engine.connector_load_source == "truth" for s in drawn)
    assert set(CONNECTOR_KNOBS) == {n for n in knobs() if n.startswith("connector_")}
