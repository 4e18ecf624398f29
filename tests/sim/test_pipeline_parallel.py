"""Pipeline-parallel stages under async scheduling (engine.pipeline_parallel_size): the batch queue
is vLLM's `max_concurrent_batches` deep, the AsyncScheduler staggers a request's decodes, and the
worker takes back the drafts of every batch still in flight."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest

from mambafuzz.checks.pipeline import evaluate
from mambafuzz.model.generate import random_scenario
from mambafuzz.model.scenario import (
    EngineConfig,
    RequestSpec,
    Scenario,
    ScenarioError,
    validate,
    with_runner,
    with_scheduling,
)
from mambafuzz.sim.bridge import scheduler_session
from mambafuzz.sim.engine import harness
from mambafuzz.sim.engine.engine_core import Batch, BatchQueue


def pipelined(stages: int, **kw) -> Scenario:
    engine = EngineConfig(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=256, spec_method="mtp",
                          num_speculative_tokens=2, pipeline_parallel_size=stages, **kw)
    return Scenario(engine, prefixes=[150],
                    requests=[RequestSpec(0, [0], 30, 12), RequestSpec(2, [0], 50, 10), RequestSpec(9, [0], 5, 6)],
                    acceptance=[2, 0, 1], token_seed=7)


def decode_steps(trace, rid: str) -> list[int]:
    return [rec.step for rec in trace.steps for c in rec.chunks if c.request_id == rid and c.num_drafts]


def test_stages_are_modelled_only_on_v2_under_async_scheduling():
    assert validate(pipelined(2)) == [] and validate(pipelined(2, runner="v2", async_scheduling=True)) == []
    assert any("only on Model Runner V2" in p for p in validate(pipelined(2, runner="v1")))
    assert any("needs async scheduling" in p for p in validate(pipelined(2, async_scheduling=False)))
    with pytest.raises(ScenarioError, match="only on Model Runner V2"):
        with_runner(pipelined(2), "v1")  # an override cannot make it a config that is not modelled
    with pytest.raises(ScenarioError, match="needs async scheduling"):
        with_scheduling(pipelined(2), "sync")


def test_the_queue_is_stages_plus_one_deep_as_vllm_says_for_v2():
    for stages in (1, 2, 4):
        s = pipelined(stages)
        session = scheduler_session.SchedulerSession(s.engine, 512, s.max_model_len(), None)
        assert session.batch_queue_depth == stages + 1 and session.runner == "v2"
        assert session.scheduler.use_pp == (stages > 1)


def test_the_async_scheduler_staggers_a_requests_decodes_by_the_stage_count():
    for stages in (1, 2, 3):
        trace = harness.run(pipelined(stages))
        steps = decode_steps(trace, "r0")
        assert len(steps) > 3
        assert min(b - a for a, b in zip(steps, steps[1:])) == stages, (stages, steps)


def test_pipelined_spec_decode_with_rejected_drafts_is_clean_on_unmodified_vllm():
    for stages in (2, 3, 4):
        ev = evaluate(pipelined(stages, runner="v2"))
        assert ev.verdict.clean, (stages, ev.verdict.primary)
        assert ev.trace.batch_queue_depth == stages + 1
        assert max(b.in_flight for b in ev.trace.batches.values()) == stages + 1


def test_the_worker_takes_back_the_rejected_drafts_of_every_batch_in_flight():
    """Two unapplied batches held the request (a decode staggered by one stage, say): the scheduler
    counted both batches' drafts as accepted, so the worker takes back both counts."""
    queue = BatchQueue(3)
    out = SimpleNamespace(preempted_req_ids=set(), scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set()),
                          scheduled_new_reqs=[])
    older, newer = Batch(0, out, rejected={"r0": 2}), Batch(1, out, rejected={"r0": 1, "r1": 2})
    queue.in_flight.extendleft([older, newer])
    session = SimpleNamespace(preempted=lambda o: set())
    assert queue.worker_corrections(session, out) == {"r0": 3, "r1": 2}
    queue.in_flight.pop()  # the older batch was applied: the scheduler has rolled its drafts back
    assert queue.worker_corrections(session, out) == {"r0": 1, "r1": 2}
    dropped = SimpleNamespace(preempted_req_ids={"r1"}, scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set()),
                              scheduled_new_reqs=[])
    assert queue.worker_corrections(SimpleNamespace(preempted=lambda o: {"r1"}), dropped) == {"r0": 1}
    # ...for good: once dropped, r1 is a new request to the worker, and a later output (r1 re-admitted
    # while that batch is still in flight, as after a forced reset) takes nothing back for it
    assert queue.worker_corrections(session, out) == {"r0": 1}
    readmitted = SimpleNamespace(preempted_req_ids=set(), scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set()),
                                 scheduled_new_reqs=[SimpleNamespace(req_id="r0")])
    assert queue.worker_corrections(session, readmitted) == {}


def test_the_generator_draws_stages_only_where_they_are_modelled():
    rng = random.Random(5)
    drawn = [random_scenario(rng) for _ in range(400)]
    staged = [s for s in drawn if s.engine.pipeline_parallel_size > 1]
    assert 20 <= len(staged) <= 100
    assert all(s.engine.async_scheduling is not False and validate(s) == [] for s in staged)
    assert {s.engine.pipeline_parallel_size for s in staged} == {2, 3, 4}


def test_the_trace_names_the_queue_depth_and_the_engine_tier_refuses_stages():
    from mambafuzz.engine_tier import engines
    from mambafuzz.store.report import step_table

    trace = harness.run(pipelined(2))
    assert "3 batches in flight" in step_table(trace)
    assert "pipeline_parallel_size 2" in engines.unsupported(pipelined(2))
    one_stage = dataclasses.replace(pipelined(2), engine=dataclasses.replace(pipelined(2).engine, pipeline_parallel_size=1))
    assert "pipeline" not in (engines.unsupported(one_stage) or "")


def test_the_liveness_bound_leaves_room_for_the_decode_stagger_of_four_stages():
    """A default campaign filed `stall:nocache-step-bound` on this case: one token a step, four
    stages, r1 continues r0. Without prefix caching r1 re-prefills r0's prompt and outputs, then
    decodes one token every 4 steps (the stagger) and finishes at step 65; the bound was 62, one
    step per token. A tool artifact, not a vLLM stall."""
    engine = EngineConfig(mamba_block_size=8, attn_block_size=8, max_num_batched_tokens=1, max_num_seqs=1,
                          prefix_cache_retention_interval=0, pipeline_parallel_size=4)
    s = Scenario(engine=engine, prefixes=[8], token_seed=0,
                 requests=[RequestSpec(prefix_ids=[0], unique_len=1, max_tokens=2),
                           RequestSpec(unique_len=0, max_tokens=8, continues=0)])
    ev = evaluate(s, "fixed")
    assert ev.verdict.clean, [f.signature for f in ev.verdict.findings]
    assert len(ev.uncached.steps) > s.size()[2] + 8 * 2 + 16  # past what one step per token allows
