"""The attention blocks a prefix-cache hit serves: each must hold the K/V of the request's own
prefix up to its end (mambafuzz.sim.engine.attention_kv records where one did not). vLLM keys a full
attention block in `allocate_slots`, before the forward that computes it (v1/core/kv_cache_manager.py
606-616, `cache_blocks` up to num_computed + num_new_tokens); a block keyed for tokens no forward
then computes holds another prefix's K/V or none, and a request served it reads that instead of
its own context: the attention twin of a mamba `slot_hash` finding. A pure function of the trace,
registered in mambafuzz/findings.py."""

from __future__ import annotations

from mambafuzz.findings import Finding
from mambafuzz.sim.trace import Trace


class AttentionStaleHit(Finding):
    """A prefix-cache hit served an attention block that does not hold the K/V its key names."""

    kind = "attention_kv"


def check_attention_hits(trace: Trace, uncached: Trace | None = None) -> Finding | None:
    """The first stale attention block a hit served (only the run with prefix caching has hits)."""
    if not trace.attention_stale_hits:
        return None
    step, rid, group, column, block, tokens, ever = trace.attention_stale_hits[0]
    kind = trace.group_kinds[group] if group < len(trace.group_kinds) else "attention"
    what = ("K/V of another prefix" if ever else
            "no K/V any forward completed since it was handed out (keyed before its tokens were computed)")
    return AttentionStaleHit(
        f"step {step}: {rid}'s prefix-cache hit serves attention block {block} (KV-cache group {group}, {kind}, "
        f"column {column}) as the K/V of its first {tokens} tokens, but the block holds {what}",
        location=f"stale-hit/{kind}", step=step, request_id=rid,
        mechanism="other-prefix" if ever else "never-computed")
