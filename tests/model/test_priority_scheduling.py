"""vLLM's priority scheduling as a knob: `engine.scheduling_policy` and `RequestSpec.priority` reach
vLLM's SchedulerConfig and Request, the generator draws them last, files without them are unchanged,
and bad values are one line each."""

from __future__ import annotations

import dataclasses
import json

from mambafuzz.model.scenario import (
    MAX_PRIORITY,
    EngineConfig,
    RequestSpec,
    Scenario,
    ScenarioError,
    from_json,
    loads,
    min_pool_blocks,
    validate,
)
from mambafuzz.search import minimizer
from mambafuzz.sim.engine import harness
from tests.conftest import drawn_with_and_without


def _two(policy: str = "priority", priorities=(1, 0), pool_extra: int | None = None) -> Scenario:
    s = Scenario(EngineConfig(mamba_block_size=16, attn_block_size=16, max_num_batched_tokens=48, max_num_seqs=4,
                              async_scheduling=False, scheduling_policy=policy),
                 prefixes=[], requests=[RequestSpec(0, [], 40, 30, priority=priorities[0]),
                                        RequestSpec(1, [], 30, 30, priority=priorities[1])], token_seed=1)
    if pool_extra is not None:
        s.engine.num_gpu_blocks = min_pool_blocks(s) + pool_extra
    return s


def test_priorities_are_the_generators_last_draw():
    """Resetting the policy and priorities gives exactly the scenario the same input gave before the knob;
    about a sixth of the multi-request scenarios are drawn under priority, each priority in [0, 3]."""
    drawn, before = drawn_with_and_without("_draw_priorities", range(300))  # later draws left out of both
    under = [s for s in drawn if s.engine.scheduling_policy == "priority"]
    assert 25 <= len(under) <= 75
    assert all(len(s.requests) > 1 and all(0 <= r.priority <= 3 for r in s.requests) for s in under)
    assert any(len({r.priority for r in s.requests}) > 1 for s in under)
    for s, b in zip(drawn, before):
        s.engine.scheduling_policy = "fcfs"
        for r in s.requests:
            r.priority = 0
        assert s == b


def test_files_without_the_knob_round_trip_unchanged_and_with_it_keep_it():
    plain = _two("fcfs", (0, 0))
    raw = plain.to_json()
    assert "scheduling_policy" not in raw["engine"] and all("priority" not in r for r in raw["requests"])
    prio = _two()
    raw = prio.to_json()
    assert raw["engine"]["scheduling_policy"] == "priority" and raw["requests"][0]["priority"] == 1
    assert "priority" not in raw["requests"][1]
    assert loads(prio.dumps()) == prio


def test_bad_values_are_one_line_each():
    bad = _two()
    bad.requests[0].priority = MAX_PRIORITY + 1
    assert validate(bad) == [f"requests[0].priority must be in [0, {MAX_PRIORITY}], got {MAX_PRIORITY + 1}"]
    raw = _two().to_json()
    raw["engine"]["scheduling_policy"] = "lifo"
    try:
        from_json(json.loads(json.dumps(raw)))
    except ScenarioError as exc:
        assert any("scheduling_policy" in p for p in exc.problems)
    else:
        raise AssertionError("an unknown policy was accepted")


def test_the_policy_and_priorities_reach_vllm():
    """On a pool that holds both prompts but not both decodes, vLLM preempts by its policy: the running
    request with the largest (priority, arrival) under "priority" (scheduler.py:795-800), the last
    running one under "fcfs"."""
    preempted = {}
    for policy, priorities in (("priority", (0, 1)), ("priority", (1, 0)), ("fcfs", (0, 0))):
        s = _two(policy, priorities, pool_extra=0)
        assert not validate(s)
        trace = harness.run(s)
        preempted[(policy, priorities)] = {rid for rec in trace.steps for rid in rec.preempted}
    assert preempted[("priority", (0, 1))] == {"r1"}
    assert preempted[("priority", (1, 0))] == {"r0"}
    assert preempted[("fcfs", (0, 0))] == {"r1"}


def test_the_minimizer_moves_priorities_to_zero_and_the_policy_to_fcfs():
    s = _two()
    candidates = list(minimizer._simplify_engine(s)) + list(minimizer._shrink_numbers(s))
    assert any(c.engine.scheduling_policy == "fcfs" for c in candidates)
    assert any(c.requests[0].priority == 0 and c.engine == s.engine for c in candidates)
    assert dataclasses.replace(s.engine, scheduling_policy="fcfs") != s.engine
