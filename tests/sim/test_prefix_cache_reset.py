"""The prefix-cache reset event reaches vLLM through the bridge (`SchedulerSession.reset_prefix_cache`,
vLLM's `Scheduler.reset_prefix_cache`) at the engine step's input, synchronously and with a batch in flight:
the cache is empty after a reset that says so, a preempting reset hands the worker its running requests back
as preempted and then resumed (it keeps tables from SchedulerOutput alone), and a reset that keeps running
requests fails while they hold blocks and changes nothing."""

from __future__ import annotations

import dataclasses

import pytest

from mambafuzz.checks.pipeline import evaluate
from mambafuzz.model.scenario import EngineConfig, PrefixCacheReset, RequestSpec, Scenario, validate
from mambafuzz.sim.bridge import scheduler_session
from mambafuzz.sim.bridge.vllm_compat.output import resumed_req_ids
from mambafuzz.sim.engine import harness
from mambafuzz.sim.worker.worker_tables import WorkerTables


def _shared(*resets: PrefixCacheReset, async_scheduling: bool = False) -> Scenario:
    """r0 and r1 share a 200-token prefix (r1 hits 192 tokens of it); r2 sends it again once both finished."""
    s = Scenario(EngineConfig(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=64, max_num_seqs=4,
                              async_scheduling=async_scheduling),
                 prefixes=[200], requests=[RequestSpec(0, [0], 20, 6), RequestSpec(2, [0], 30, 6), RequestSpec(20, [0], 10, 3)],
                 token_seed=1, prefix_cache_resets=list(resets))
    assert not validate(s)
    return s


def test_the_bridge_empties_the_cache_and_hands_the_worker_the_preempted_requests():
    s = _shared()
    session = scheduler_session.SchedulerSession(s.engine, 64, s.max_model_len(), None, False)
    session.add_request("a", s.prompt_tokens(0), 6, 0.0)
    tables = WorkerTables(session.mamba_groups, session.runner)
    for _ in range(4):  # a's prompt prefills in 64-token chunks, publishing its blocks
        out = session.schedule()
        tables.update(out)
        session.feed(out, {"a": []}, set())
    assert session.cache_keys() and session.scheduler.running
    kept = session.reset_prefix_cache(False)  # a holds blocks: vLLM refuses and leaves the cache alone
    assert not kept.succeeded and kept.keys_after == kept.keys_before and not kept.preempted
    reset = session.reset_prefix_cache(True)
    assert reset.succeeded and reset.preempted == ("a",)
    assert reset.keys_before and not reset.keys_after and not reset.hashed_after and not session.cache_keys()
    assert not session.scheduler.running
    out = session.schedule()  # the worker learns it from the next SchedulerOutput: preempted, and back at token 0
    assert session.preempted(out) == {"a"}
    assert "a" in resumed_req_ids(out) or any(r.req_id == "a" for r in out.scheduled_new_reqs)
    tables.update(out)
    assert tables.computed["a"] == 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_preempting_reset_restarts_the_running_requests_with_the_same_outputs(async_scheduling):
    """At step 5 r0 runs (under async with a batch in flight): the reset preempts the running requests, r0
    starts again with no hit, and every request generates what it generates without the reset; the verdict
    is clean (but for the async in-flight state block filed in corpus/upstream)."""
    plain = harness.run(_shared(async_scheduling=async_scheduling))
    s = _shared(PrefixCacheReset(5, True), async_scheduling=async_scheduling)
    trace = harness.run(s)
    assert trace.crash is None and not trace.unfinished
    (reset,) = trace.resets
    assert reset.succeeded and "r0" in reset.preempted and reset.keys_before and not reset.keys_left
    if async_scheduling:
        assert trace.batches[5].in_flight  # the engine core still had a batch queued when the reset came
    assert set(reset.preempted) <= {rid for rec in trace.steps[5:] for rid in rec.preempted}
    readmitted = {a.request_id: a.local_hit_tokens for rec in trace.steps[5:] for a in rec.admissions}
    assert readmitted["r0"] == 0
    assert trace.outputs == plain.outputs
    verdict = evaluate(s, "fixed").verdict
    assert [f.signature for f in verdict.findings if not f.signature.startswith("capacity:held-over-reserve")] == []


def test_a_reset_that_keeps_running_requests_fails_while_they_hold_blocks_and_succeeds_once_idle():
    s = _shared(PrefixCacheReset(5), PrefixCacheReset(18))
    trace = harness.run(s)
    busy, idle = trace.resets
    assert not busy.succeeded and busy.unchanged and not busy.preempted
    assert idle.succeeded and idle.keys_before and not idle.keys_left
    r2 = next(a for rec in trace.steps for a in rec.admissions if a.request_id == "r2")
    assert r2.local_hit_tokens == 0  # the cache was emptied at step 18
    assert evaluate(s, "fixed").verdict.clean


def test_the_uncached_twin_takes_the_same_resets():
    s = _shared(PrefixCacheReset(5, True))
    trace = harness.run(s, prefix_caching=False)
    assert [(r.step, r.succeeded, set(r.preempted)) for r in trace.resets] == [(5, True, {"r0", "r1"})]


def test_a_reset_due_after_the_run_ended_never_happens():
    s = dataclasses.replace(_shared(), requests=_shared().requests[:2], prefix_cache_resets=[PrefixCacheReset(60, True)])
    assert harness.run(s).resets == []


class _Block:
    def __init__(self, block_id: int, key: bytes):
        self.block_id, self.block_hash, self.block_hash_num_tokens = block_id, key, 64


class _Cache:
    """The two things CacheScan asks of a session: the key map's version and its mamba keys."""

    def __init__(self):
        self.version, self.keys = 0, []

    def cache_keys_version(self) -> int:
        return self.version

    def take_added_mamba_keys(self):
        return None

    def cached_mamba_blocks(self):
        return iter(self.keys)


class _Auditor:
    def __init__(self):
        self.model = type("Model", (), {"dirty": set()})()

    def entry(self, block_hash, block_id, primary, recorded_tokens, new):
        return block_id, new


def test_a_key_published_again_on_the_same_block_after_a_reset_is_new_to_the_audit():
    """The stale-hit rule counts entries new since the reset: a prompt republished after the reset under the
    same key on the same block id (a small pool hands blocks round) must be new, and a key that survived
    the reset must not."""
    from mambafuzz.sim.engine.cache_scan import CacheScan
    from mambafuzz.sim.trace import StepRecord, Trace

    key = b"k" * 32 + b"\x00\x00\x00\x01"
    cache, trace = _Cache(), Trace(split="fixed", prefix_caching=True)
    scan = CacheScan(cache, _Auditor(), trace)
    cache.keys, cache.version = [(key, _Block(5, key))], 1
    first = StepRecord(0)
    scan.step(first)
    assert first.cache == [(5, True)]
    scan.after_reset(frozenset())  # the reset emptied the cache; the same pair comes back later
    cache.version += 1
    again = StepRecord(1)
    scan.step(again)
    assert again.cache == [(5, True)]
    scan.after_reset(frozenset({(key, 5)}))  # a reset that left the key: it is not new after it
    cache.version += 1
    kept = StepRecord(2)
    scan.step(kept)
    assert kept.cache == []


def test_a_request_readmitted_after_a_forced_reset_runs_from_where_it_is_told():
    """Found by a 10-minute campaign (2026-12-07): pipeline stages 2 (three batches in flight), MTP, a
    preempting reset at step 13. vLLM drops the request's in-flight output and re-admits it at once;
    the drafts its earlier incarnation had rejected in batches still in flight must not move the new
    incarnation's rows (engine_core.BatchQueue.worker_corrections). Before the fix the row ran from
    token 7 after a re-prefill to 8, and a later one past the request's tokens."""
    from pathlib import Path

    from mambafuzz.model.scenario import loads

    case = Path(__file__).resolve().parents[2] / "corpus" / "seeds" / "prefix_cache_reset_under_pipeline_mtp.json"
    s = loads(case.read_text())
    assert s.engine.pipeline_parallel_size == 2 and s.prefix_cache_resets[0].reset_running_requests
    v = evaluate(s, "fixed", efficiency=False)
    assert v.verdict.clean, [f.message for f in v.verdict.findings]
    assert any(rec.preempted for rec in v.trace.steps)  # the reset did preempt the running request
    starts = [c.start for rec in v.trace.steps for c in rec.chunks]
    assert min(starts) >= 0
