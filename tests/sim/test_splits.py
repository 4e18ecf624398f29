"""The baselines differ from the installed split only in the two gates: our restatement
with both gates fixed schedules exactly what the installed method schedules."""

import random

import pytest

from mambafuzz.model.generate import random_scenario
from mambafuzz.model.scenario import validate
from mambafuzz.sim.engine import harness, splits


def chunks(trace):
    return [[(c.request_id, c.start, c.num_tokens) for c in rec.chunks] for rec in trace.steps]


@pytest.mark.parametrize("seed", range(4))
def test_restated_split_matches_the_installed_one(seed):
    rng = random.Random(seed)
    compared = 0
    while compared < 25:
        s = random_scenario(rng)
        if validate(s):
            continue
        assert chunks(harness.run(s, None, "fixed")) == chunks(harness.run(s, splits.restated_fixed_split, "restated")), s.dumps()
        compared += 1


def test_resolve_names_and_user_functions():
    assert splits.resolve("fixed") is None
    assert splits.resolve("prefix") is splits.prefix_split
    assert splits.resolve("mambafuzz.sim.engine.splits:realign_split") is splits.realign_split
    for bad, needle in [("nope", "unknown split"), ("no_such_mod:f", "cannot import"), ("mambafuzz.sim.engine.splits:missing", "no callable")]:
        with pytest.raises(splits.SplitError, match=needle):
            splits.resolve(bad)
