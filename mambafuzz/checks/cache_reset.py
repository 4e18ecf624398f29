"""The engine's `reset_prefix_cache` (Scenario.prefix_cache_resets): what vLLM 0.32 promises of it.

- A reset that returns True empties the prefix cache: `BlockPool.reset_prefix_cache` (block_pool.py:827-863)
  replaces the key map and resets every block's hash (it refuses, returning False, while any block but the
  null block is in use, :837-844); `KVCacheManager.reset_prefix_cache` (kv_cache_manager.py:674-690) resets
  each pool once through the coordinator (kv_cache_coordinator.py:393-398). So no request can be served a
  prefix hit from a block published before the reset, unless that state was published again since.
- A reset that returns False leaves the cache as it was (the pool returns before touching it). Under
  `reset_running_requests` it never returns False: it raises (scheduler.py:2868-2874).

The harness records each call's answer and the cache around it (`Trace.resets`) and every mamba cache entry
new since (`StepRecord.cache`); the check is a pure function of the trace. No other oracle sees a stale key:
the state a surviving key serves is still the right one in a run (the reset is about weights the run never
changes), so the state, attention and pool checks pass it.
"""

from __future__ import annotations

from mambafuzz.findings import Finding
from mambafuzz.sim.trace import Trace


class PrefixCacheResetBroken(Finding):
    """A reset that said it emptied the prefix cache left keys, a failed one changed the cache, or a
    request after a reset was served a hit from a state not published since."""

    kind = "prefix_cache_reset"


def check_prefix_cache_resets(trace: Trace, uncached: Trace | None = None) -> Finding | None:
    """The earliest broken promise: at a reset (its answer against the cache after it), or at an admission
    after a successful reset whose local hit no entry published since the reset claims."""
    if not trace.prefix_caching or not trace.resets:
        return None
    for r in trace.resets:
        if r.succeeded and (r.keys_left or r.hashed_left):
            where = f"block {r.keys_left[0][0]}" if r.keys_left else f"block {r.hashed_left[0]}"
            return PrefixCacheResetBroken(
                f"step {r.step}: reset_prefix_cache returned True but left {len(r.keys_left)} of its {r.keys_before} "
                f"prefix-cache keys and {len(r.hashed_left)} hashed blocks ({where} first)",
                location="keys-left", step=r.step)
        if not r.succeeded and not r.unchanged:
            return PrefixCacheResetBroken(
                f"step {r.step}: reset_prefix_cache returned False but changed the prefix cache "
                f"({r.keys_before} keys before, {r.keys_after} after)", location="failed-reset-changed-cache", step=r.step)
    return _stale_hit(trace)


def _stale_hit(trace: Trace) -> Finding | None:
    """A local hit after a successful reset must be a state some cache entry claimed since that reset: the
    entry the hit's mamba boundary uses (a hit ends on a mamba state, `HybridKVCacheCoordinator`) was keyed
    after the reset. Entries keyed in the admission's own step count (a same-step hit)."""
    resets = {r.step for r in trace.resets if r.succeeded}
    published: set | None = None  # states claimed by entries new since the last successful reset
    for rec in trace.steps:
        if rec.step in resets:
            published = set()
        if published is None:
            continue
        for e in rec.cache:
            if e.new:
                published.add(e.claimed)
        for a in rec.admissions:
            if not a.local_hit_tokens or a.external_tokens:
                continue
            chunk = next((c for c in rec.chunks if c.request_id == a.request_id and c.first_after_admission), None)
            if chunk is not None and chunk.true_state not in published:
                return PrefixCacheResetBroken(
                    f"step {rec.step}: {a.request_id} was served a prefix hit of {a.local_hit_tokens} tokens "
                    f"({chunk.true_state}), but no cache entry has claimed that state since the prefix cache was "
                    f"reset at step {max(s for s in resets if s <= rec.step)}",
                    location="stale-hit", step=rec.step, request_id=a.request_id)
    return None
