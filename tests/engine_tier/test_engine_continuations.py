"""The engine tier refuses continuations and prefix-cache resets, with the reason."""

from mambafuzz.engine_tier import engines
from tests.sim.test_harness_continuations import turns


def test_the_engine_tier_says_unsupported_for_a_continuation():
    why = engines.unsupported(turns())
    assert why is not None and "continues an earlier one" in why
    s = turns()
    s.requests = s.requests[:1]
    assert engines.unsupported(s) is None or "continues" not in engines.unsupported(s)


def test_the_engine_tier_says_unsupported_for_prefix_cache_resets():
    from pathlib import Path

    from mambafuzz.store import corpus

    case = corpus.load_case(Path(__file__).resolve().parents[2] / "corpus/seeds/prefix_cache_reset_running_and_idle.json")
    why = engines.unsupported(case.scenario)
    assert why is not None and "reset_prefix_cache" in why and "\n" not in why
    case.scenario.prefix_cache_resets = []
    assert "reset_prefix_cache" not in (engines.unsupported(case.scenario) or "")
