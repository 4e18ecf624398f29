"""Continuations through vLLM's real scheduler: the prompt is built at arrival from what the
simulated model really generated, hits reach into generated (decode-written) blocks, and a bug in
what a decode row writes is judged when a continuation reads it back."""

import dataclasses

import pytest

from mambafuzz.checks.pipeline import evaluate
from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario, with_scheduling
from mambafuzz.sim.engine import harness
from mambafuzz.sim.state import State
from mambafuzz.sim.worker.kernel_model import KernelModel
from mambafuzz.store.report import step_table, trace_digest
from tests.helpers.known import unexplained


def turns(**engine) -> Scenario:
    """r0: a 100-token prompt decoding 60 tokens, so its block ending at 128 is completed during
    decode; r1 continues it (all 60 outputs, then a 20-token message); dense retention keeps the
    decode-completed block. r2 takes exactly 28 outputs and no message: a 128-token prompt."""
    return Scenario(EngineConfig(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=256,
                                 prefix_cache_retention_interval=None, **engine),
                    requests=[RequestSpec(0, [], 100, 60), RequestSpec(0, [], 20, 8, continues=0),
                              RequestSpec(0, [], 0, 4, continues=0, continue_outputs=28)], token_seed=1)


def admissions(trace) -> dict[str, int]:
    return {a.request_id: a.local_hit_tokens for rec in trace.steps for a in rec.admissions}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_prompt_is_built_from_what_the_model_generated_and_hits_its_decode_block(mode):
    s = with_scheduling(turns(), mode)
    trace = harness.run(s, None, "fixed")
    assert trace.crash is None and not trace.unfinished
    r0 = trace.outputs["r0"]
    assert len(r0) == 60
    assert {rid: c[:2] for rid, c in trace.continuations.items()} == {"r1": ("r0", 60), "r2": ("r0", 28)}
    assert trace.prompt_lens["r1"] == 180 and trace.prompt_lens["r2"] == 128
    arrive = {rid: rec.step for rec in trace.steps for rid in rec.arrivals}
    finish = {rid: rec.step for rec in trace.steps for rid in rec.finished}
    assert arrive["r1"] > finish["r0"]  # after r0 ended, though due at step 0
    hits = admissions(trace)
    assert hits["r1"] == 128  # past r0's 100-token prompt: the block r0 completed during decode
    assert hits["r2"] == 64  # a prompt ending on a block boundary: the hit stops at prompt_len - 1
    first = next(c for rec in trace.steps for c in rec.chunks if c.request_id == "r1")
    assert first.start == 128 and first.read_state == first.true_state
    assert trace_digest(harness.run(s, None, "fixed")) == trace_digest(trace)  # replays byte for byte


def test_vllm_is_given_the_earlier_prompt_its_outputs_and_the_new_tail(monkeypatch):
    from mambafuzz.sim.bridge import scheduler_session

    given: dict[str, list[int]] = {}
    original = scheduler_session.SchedulerSession.add_request

    def record(self, rid, prompt, max_tokens, arrival, priority=0):
        given[rid] = list(prompt)
        return original(self, rid, prompt, max_tokens, arrival, priority)

    monkeypatch.setattr(scheduler_session.SchedulerSession, "add_request", record)
    s = turns()
    trace = harness.run(s, None, "fixed")
    assert given["r1"] == s.prompt_tokens(0) + trace.outputs["r0"] + s.tail_tokens(1)
    assert given["r2"] == s.prompt_tokens(0) + trace.outputs["r0"][:28]


def test_the_differential_and_every_oracle_pass_on_unmodified_vllm():
    for mode in ("sync", "async"):
        ev = evaluate(with_scheduling(turns(), mode), "fixed")
        assert ev.verdict.clean, ev.verdict.primary
        assert ev.uncached.continuations == ev.trace.continuations  # built from its own outputs


def test_a_retry_after_a_mid_prefill_abort_resends_the_same_prompt_and_hits_it():
    s = Scenario(EngineConfig(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=64,
                              prefix_cache_retention_interval=None, async_scheduling=False),
                 requests=[RequestSpec(0, [], 300, 4, abort_step=3), RequestSpec(0, [], 0, 4, continues=0,
                                                                                  continue_outputs=0)])
    trace = harness.run(s, None, "fixed")
    assert trace.finish_status["r0"] == "FINISHED_ABORTED" and trace.outputs["r0"] == []
    assert trace.continuations["r1"][:2] == ("r0", 0) and trace.prompt_lens["r1"] == 300
    assert admissions(trace)["r1"] == 192  # the three chunks r0 computed before its abort
    assert evaluate(s, "fixed").verdict.clean


def test_the_trace_shows_the_continuation_at_arrival():
    text = step_table(harness.run(turns(), None, "fixed"))
    assert "r1 continues r0 (+60 generated tokens; prompt 180 tokens)" in text
    assert "r2 continues r0 (+28 generated tokens; prompt 128 tokens)" in text


def test_the_bare_loop_builds_continuations_from_the_sessions_tokens():
    """StepPlan.feed (the speed bench's and the conformance driver's loop) with a constant worker."""
    from mambafuzz.model.scenario import ample_pool_blocks
    from mambafuzz.model.step_plan import StepPlan
    from mambafuzz.sim.bridge import scheduler_session
    from mambafuzz.sim.engine.engine_core import BatchQueue
    from mambafuzz.sim.worker.constant_worker import ConstantWorker

    s = with_scheduling(turns(), "sync")
    session = scheduler_session.SchedulerSession(s.engine, ample_pool_blocks(s), s.max_model_len(), None, False)
    queue = BatchQueue(session.batch_queue_depth)
    worker, plan, prompts = ConstantWorker(session, s, queue), StepPlan.of(s), s.static_prompts()
    step = 0
    while plan.end(step, session.has_unfinished() or bool(queue)) is None:
        plan.feed(step, session, prompts)
        queue.step(session, lambda b, step=step: worker.forward(b, step), lambda b, step=step: worker.apply(b, step))
        step += 1
    r0, r1, r2 = (session.request(rid) for rid in ("r0", "r1", "r2"))
    assert list(r1.prompt_token_ids) == list(r0.all_token_ids) + s.tail_tokens(1)
    assert list(r2.prompt_token_ids) == list(r0.all_token_ids)[:128]
    assert r1.is_finished() and r2.is_finished()


def _corrupt_decode_boundary_blocks(monkeypatch):
    """A planted worker bug: when a decode row crosses into a new mamba block (the align-mode
    pre-copy, `preprocess_mamba`), the block it leaves, just completed during decode and about to be
    published as the state at its boundary, is overwritten with a wrong state. The request itself
    goes on from the correct copy, so its own outputs are unaffected."""
    original = KernelModel.run_rows  # the harness runs every group's row through the first group's model

    def planted(self, rid, tables, num_computed, tokens, num_drafts, spec_row=False, truth=None, followers=(),
                sample=True):
        prev = self._prev_column.get(rid)
        rows = original(self, rid, tables, num_computed, tokens, num_drafts, spec_row, truth, followers, sample)
        if len(tokens) - num_drafts == 1 and any(cause == "precopy" for *_, cause in rows[0].writes):
            for model, table in zip((self, *followers), tables):  # followers copy in lockstep; their writes go unreported
                held = model.state_of(table[prev])
                model._write(table[prev], State(held.num_tokens, held.fingerprint ^ 0x5A5A))
        return rows

    monkeypatch.setattr(KernelModel, "run_rows", planted)


def test_a_bad_write_to_a_decode_completed_block_is_caught_when_a_continuation_reads_it(monkeypatch):
    linked = with_scheduling(turns(), "sync")
    assert evaluate(linked, "fixed").verdict.clean  # unplanted
    _corrupt_decode_boundary_blocks(monkeypatch)
    ev = evaluate(linked, "fixed")
    kinds = {f.kind for f in ev.verdict.findings}
    # the continuation restores r0's decode-written block at 128 and reads the wrong state
    assert "resume_state" in kinds or "stale_read" in kinds, kinds
    read = next(c for rec in ev.trace.steps for c in rec.chunks if c.request_id == "r1")
    assert read.start == 128 and read.read_state != read.true_state
    # Without the link r1 is an unrelated prompt: nothing reads the block back. The cache audit
    # still judges the published block itself (slot_hash), but no read-side oracle fires.
    unlinked = dataclasses.replace(linked, requests=[dataclasses.replace(r, continues=None, continue_outputs=None,
                                                                         unique_len=max(r.unique_len, 1))
                                                     for r in linked.requests])
    ev = evaluate(unlinked, "fixed")
    kinds = {f.kind for f in ev.verdict.findings}
    assert "resume_state" not in kinds and "stale_read" not in kinds
    assert "slot_hash" in kinds, kinds


def test_a_continuation_of_a_request_an_abort_caught_at_different_points_is_not_a_divergence():
    """Found by the first fuzz run with continuations (a tool artifact, not vLLM's): the cached run
    reached r0's abort before r0 sampled its one token, the uncached run after, so each run gave r1
    another prompt (33 and 34 tokens) and their outputs differ with no state read wrong."""
    s = Scenario(EngineConfig(mamba_block_size=16, attn_block_size=16, max_num_batched_tokens=17),
                 prefixes=[16], requests=[RequestSpec(5, [0, 0], 1, 1, abort_step=8),
                                          RequestSpec(8, [], 0, 1, continues=0)])
    ev = evaluate(s, "fixed")
    assert ev.trace.continuations["r1"][:2] == ("r0", 0) and ev.uncached.continuations["r1"][:2] == ("r0", 1)
    assert ev.trace.prompt_lens["r1"] == 33 and ev.uncached.prompt_lens["r1"] == 34
    assert unexplained(s, "fixed") is None  # no divergence (clean apart from triaged upstream behaviour)
