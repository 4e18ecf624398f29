"""The differential compares a continuation's outputs only when both runs gave it the same prompt."""

from mambafuzz.checks.oracle import check_outputs
from mambafuzz.sim.trace import Trace


def run(caching: bool, continuations: dict, r1: list[int]) -> Trace:
    return Trace("fixed", caching, outputs={"r0": [5, 6], "r1": r1},
                 finish_status={"r0": "FINISHED_LENGTH_CAPPED", "r1": "FINISHED_LENGTH_CAPPED"},
                 continuations=continuations)


def test_a_continuation_with_the_same_prompt_in_both_runs_is_compared():
    same = {"r1": ("r0", 2, 1234)}
    f = check_outputs(run(True, same, [7, 8]), run(False, dict(same), [7, 9]))
    assert f is not None and f.kind == "output_divergence" and f.request_id == "r1"
    assert check_outputs(run(True, same, [7, 8]), run(False, dict(same), [7, 8])) is None


def test_a_continuation_given_another_prompt_by_each_run_is_not_compared():
    cached, uncached = {"r1": ("r0", 1, 1234)}, {"r1": ("r0", 2, 4321)}
    assert check_outputs(run(True, cached, [7, 8]), run(False, uncached, [1, 2])) is None
    # ... while a request that is no continuation is still compared beside it
    a, b = run(True, cached, [7, 8]), run(False, uncached, [1, 2])
    b.outputs["r0"] = [5, 7]
    assert check_outputs(a, b).request_id == "r0"
