"""The attention groups' prefix-cache keys: a cached attention block is published under the hash
of its own request's tokens at its own position (the mamba groups' keys are judged by what the
block holds, `slot_hash`, in mambafuzz/checks/oracle.py).

vLLM's tests assert it for their inputs (tests/v1/core/test_prefix_caching.py `test_prefill`,
`test_prefill_hybrid_model`: block i's `get_block_hash(block_hash)` is the hash of the request's
first (i + 1) * block_size tokens and `get_group_id` its group); docs/VLLM_TEST_INVARIANTS.md.
The harness checks each request's tables as vLLM frees it (SchedulerSession.watch_frees) and
records what breaks the rule in `Trace.attention_keys`; the check is a pure function of the traces.
"""

from __future__ import annotations

from mambafuzz.findings import Finding
from mambafuzz.sim.trace import Trace


class AttentionKeyMismatch(Finding):
    """A cached attention block in a request's table is published under a key that is not that
    request's hash of the tokens the key claims, or claims tokens outside the block's column: a
    later request with those hashes would read KV of other tokens."""

    kind = "attention_key"


def _where(what: str) -> str:
    if "another group's id" in what:
        return "wrong-group"
    if "not inside column" in what or "past the request's" in what:
        return "wrong-position"
    return "wrong-hash"


def check_attention_keys(trace: Trace, uncached: Trace | None = None) -> Finding | None:
    """The first block whose key broke the rule when its request was freed (with prefix caching off
    nothing is keyed, so only the cached run is judged)."""
    if not trace.attention_keys:
        return None
    step, rid, group, column, block, what = trace.attention_keys[0]
    return AttentionKeyMismatch(
        f"step {step}: when vLLM freed {rid}, block {block} at column {column} of its KV-cache group {group} "
        f"(attention) carried {what}",
        location=_where(what), step=step, request_id=rid)
