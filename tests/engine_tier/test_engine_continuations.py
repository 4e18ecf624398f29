"""The engine tier refuses continuations, with the reason."""

from mambafuzz.engine_tier import engines
from tests.sim.test_harness_continuations import turns


def test_the_engine_tier_says_unsupported_for_a_continuation():
    why = engines.unsupported(turns())
    assert why is not None and "continues an earlier one" in why
    s = turns()
    s.requests = s.requests[:1]
    assert engines.unsupported(s) is None or "continues" not in engines.unsupported(s)
