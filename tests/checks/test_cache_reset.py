"""The prefix-cache reset oracle (mambafuzz/checks/cache_reset.py): silent on unmodified vLLM for scenarios
built to reset, and firing on each broken promise: a planted vLLM bug whose reset leaves its keys
(`reset_keeps_key_map`), a reset that fails but changes the cache, and (on a trace built by hand) a hit after a
reset that no entry published since claims. Also the two resource rules a reset must not trip."""

from __future__ import annotations

import dataclasses

from mambafuzz.checks import cache_reset, resources
from mambafuzz.checks.pipeline import evaluate
from mambafuzz.model.scenario import EngineConfig, PrefixCacheReset, RequestSpec, Scenario
from mambafuzz.sim import patching
from mambafuzz.sim.engine import harness
from mambafuzz.sim.state import State
from mambafuzz.sim.trace import Admission, CacheEntry, Chunk, ResetRecord, StepRecord, Trace
from mambafuzz.tools.mutation import planting


def _shared(*resets: PrefixCacheReset) -> Scenario:
    return Scenario(EngineConfig(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=64, max_num_seqs=4,
                                 async_scheduling=False),
                    prefixes=[200], requests=[RequestSpec(0, [0], 20, 6), RequestSpec(2, [0], 30, 6), RequestSpec(20, [0], 10, 3)],
                    token_seed=1, prefix_cache_resets=list(resets))


def _signatures(s: Scenario, patches=()) -> list[str]:
    return [f.signature for f in evaluate(s, "fixed", efficiency=False, patches=list(patches)).verdict.findings]


def test_a_reset_that_keeps_its_key_map_is_found_and_attributed():
    """The planted bug clears every block's hash but keeps the map: the reset says True and the cache still
    holds every key; vLLM as installed is clean on the same input."""
    for s in (_shared(PrefixCacheReset(5, True)), _shared(PrefixCacheReset(18))):
        assert _signatures(s) == []
        found = _signatures(s, planting.patches("reset_keeps_key_map"))
        assert found[0] == "prefix_cache_reset:keys-left", found


def test_a_failed_reset_that_changes_the_cache_is_found():
    """A (test-only) reset that drops the map's keys, then reports failure: vLLM's pool returns False before
    touching anything (block_pool.py:837-844)."""
    def make(original):
        def reset(self):
            self.cached_block_hash_to_block._cache.clear()
            return False
        return reset
    s = _shared(PrefixCacheReset(5))
    assert _signatures(s) == []
    found = _signatures(s, [patching.Wrap("vllm.v1.core.block_pool:BlockPool.reset_prefix_cache", make)])
    assert found[0] == "prefix_cache_reset:failed-reset-changed-cache", found


def _hand_trace(claimed_since: bool) -> Trace:
    """A reset at step 3, then r1 admitted at step 4 with a 64-token hit; an entry new at step 4 claims that
    state only when `claimed_since`."""
    hit = State(64, 7)
    trace = Trace(split="fixed", prefix_caching=True)
    trace.resets = [ResetRecord(3, False, True, (), 2, 0, (), (), False)]
    for step in range(5):
        rec = StepRecord(step)
        trace.steps.append(rec)
    rec = trace.steps[4]
    rec.add("admissions", Admission("r1", 64, 0, False))
    rec.add("chunks", Chunk("r1", 64, 10, 0, 0, 5, hit, hit, True, True))
    rec.add("cache", CacheEntry(5, 0, hit if claimed_since else State(64, 8), hit, "r0", True, True, 64))
    return trace


def test_a_hit_after_a_reset_must_be_on_a_state_published_since():
    assert cache_reset.check_prefix_cache_resets(_hand_trace(claimed_since=True)) is None
    found = cache_reset.check_prefix_cache_resets(_hand_trace(claimed_since=False))
    assert found is not None and found.signature == "prefix_cache_reset:stale-hit" and found.request_id == "r1"
    trace = _hand_trace(claimed_since=False)
    trace.resets = [trace.resets[0]._replace(succeeded=False, unchanged=True)]  # a failed reset promises nothing
    assert cache_reset.check_prefix_cache_resets(trace) is None


def test_a_successful_reset_excuses_a_missed_hit_and_a_forced_preemption():
    """r1 resends r0's prompt after an idle reset emptied the cache: no missed hit, but the same trace
    without the reset on record is one; a request running alone that the reset preempts is no capacity breach."""
    resend = Scenario(EngineConfig(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=64, async_scheduling=False),
                      prefixes=[], requests=[RequestSpec(0, [], 200, 3), RequestSpec(20, [], 10, 2, continues=0, continue_outputs=0)],
                      prefix_cache_resets=[PrefixCacheReset(15)])
    trace = harness.run(resend)
    assert trace.resets[0].succeeded
    assert resources.check_missed_hits(trace) is None
    forgotten = dataclasses.replace(trace, resets=[])
    assert resources.check_missed_hits(forgotten).signature == "missed_hit:below-prompt-checkpoint"
    alone = Scenario(EngineConfig(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=64, async_scheduling=False),
                     prefixes=[], requests=[RequestSpec(0, [], 300, 4), RequestSpec(30, [], 10, 2)],
                     prefix_cache_resets=[PrefixCacheReset(3, True)])
    trace = harness.run(alone)
    assert trace.resets[0].preempted == ("r0",)
    assert resources.check_capacity(trace) is None
    assert resources.check_capacity(dataclasses.replace(trace, resets=[])).signature == "capacity:preempted-alone"
