"""The resource oracles: prefix caching exists to save compute, so a run that serves fewer hits
than the cache held, holds more blocks than vLLM promised at start-up, or whose block pool
miscounts is a finding even when every state it computes is right.

Each check is a pure function of the traces (the harness records the facts:
`Trace.prompts`, `lru_evictions`, `pool`, `alone`, `held_at_end`; mambafuzz/sim/engine/harness.py and
pool_facts.py) and is registered as an oracle in mambafuzz/findings.py. Every rule names the
vLLM 0.32 source it comes from (vllm/v1/core/...), and the test of vLLM's own suite
(tests/v1/core) that asserts it for its inputs; docs/ORACLES.md lists them.
"""

from __future__ import annotations

from mambafuzz.findings import Finding
from mambafuzz.sim.trace import Trace


class MissedHit(Finding):
    """A request was served a shorter prefix-cache hit than a checkpoint vLLM had cached for it."""

    kind = "missed_hit"


class CapacityBreach(Finding):
    """A request running alone needed more blocks than vLLM's start-up check reserved for it."""

    kind = "capacity"


class PoolAccounting(Finding):
    """The block pool's own counts disagree: a free count that is not the unreferenced blocks, a
    negative reference count, or blocks still held when nothing is left to run."""

    kind = "pool_accounting"


# ---- missed hits ----------------------------------------------------------------------------
def prompt_checkpoint(prompt_len: int, alignment: int, eagle_block_drop: bool) -> int:
    """The last position of a prompt of `prompt_len` tokens whose state vLLM keeps for a later
    request: the prompt's reusable boundary. One token is left to recompute (the last token's
    logits are needed: `KVCacheManager.get_computed_blocks` caps a hit at num_tokens - 1); an
    EAGLE/MTP drafter's lookup drops the last matched block, so the boundary backs off one unit
    instead (vllm/v1/kv_cache_interface.py `get_mamba_prefill_checkpoint_position`, which the
    mamba manager's `cache_blocks` keeps as `is_prompt_checkpoint` under any retention interval).
    Written here on its own; tests/checks/test_resources.py holds it to vLLM's function."""
    limit = prompt_len if eagle_block_drop else prompt_len - 1
    position = limit // alignment * alignment
    if eagle_block_drop:
        position -= alignment
    return max(position, 0)


def attention_kept(trace: Trace, prompt_len: int) -> int:
    """How far every attention group's cached blocks of a prompt reach for a later lookup: its
    full blocks only (`BlockPool.cache_full_blocks`; a partial attention hit can only make a hit
    longer, so it is left out of a lower bound), one block less under an EAGLE/MTP drafter (the
    attention finder drops the last matched block, `find_longest_cache_hit(drop_eagle_block)`).
    0 when a group is neither attention with full blocks nor mamba: no bound is claimed there."""
    kept = prompt_len
    for kind, block_size in zip(trace.group_kinds, trace.group_block_sizes):
        if kind == "mamba":
            continue
        if kind != "FullAttentionSpec":
            return 0
        reach = prompt_len // block_size * block_size - (block_size if trace.eagle_block_drop else 0)
        kept = min(kept, reach)
    return max(kept, 0)


def _applied_steps(trace: Trace) -> dict[int, int]:
    """Step a batch was scheduled at -> step its output was applied at (the same step when
    synchronous; under async scheduling a later one, `Trace.batches`)."""
    if not trace.batches:
        return {rec.step: rec.step for rec in trace.steps}
    scheduled_at = {e.scheduled: step for step, e in trace.batches.items() if e.scheduled is not None}
    return {scheduled_at[e.applied]: step for step, e in trace.batches.items()
            if e.applied is not None and e.applied in scheduled_at}


def check_missed_hits(trace: Trace, uncached: Trace | None = None) -> Finding | None:
    """A fresh request Q whose prompt starts with an earlier request R's whole prompt is served at
    least R's prompt checkpoint (`prompt_checkpoint`) when nothing can have taken it away:
    R's prefill finished, and its output was applied, before Q's admission step; R was never
    preempted and loaded no connector tokens (a load restores the state at its own end and
    computes from there: a checkpoint below it is never materialized); no cached block was evicted to hand it out (`BlockPool.get_new_blocks`) from R's
    last prefill step to Q's admission; Q claims no connector tokens (the connector's paths
    trade local hits for loads: `Scheduler.schedule`, `partial_tail`); no reset of the prefix cache
    succeeded after R's last prefill step and by Q's admission (`BlockPool.reset_prefix_cache`,
    block_pool.py:827-863, empties it). Nothing else in vLLM 0.32 takes such a hit away: the mamba manager keeps the prompt's checkpoint under every retention
    interval (`MambaManager.cache_blocks`, `is_prompt_checkpoint`), attention keeps every full
    block of the prompt (the bound is claimed only where those reach the checkpoint:
    `attention_kept`), and a hit of Q is capped at Q's num_tokens - 1 >= R's prompt length - 1.
    The hybrid finder then stops at the checkpoint or beyond: each group lowers the candidate
    only to its own longest hit (`HybridKVCacheCoordinator.find_longest_cache_hit`).
    vLLM's own tests assert the same resend hit for their prompts
    (tests/v1/core/test_prefix_caching.py, the mamba resend cases)."""
    if not trace.prefix_caching or trace.lru_evictions is None or trace.hit_alignment <= 0:
        return None
    applied = _applied_steps(trace)
    prefilled: dict[str, tuple[int, int]] = {}  # request -> (step of its last prefill chunk, step its output was applied)
    preempted: set[str] = set()
    first_admission: dict[str, tuple[int, object]] = {}
    loaded: set[str] = set(trace.external_requests)  # requests the connector loaded tokens for
    for rec in trace.steps:
        for a in rec.admissions:
            first_admission.setdefault(a.request_id, (rec.step, a))
            if a.external_tokens:
                loaded.add(a.request_id)
        for c in rec.chunks:
            prompt = trace.prompt_lens.get(c.request_id)
            if prompt is not None and c.request_id not in prefilled and c.end >= prompt and c.start < prompt:
                prefilled[c.request_id] = (rec.step, applied.get(rec.step, 1 << 30))
        preempted.update(rec.preempted)
    evicted = sorted(trace.lru_evictions)
    resets = [r.step for r in trace.resets if r.succeeded]  # a successful reset empties the cache
    for q, (step, a) in first_admission.items():
        if a.external_tokens or q in trace.external_requests:
            continue
        prompt_q = trace.prompts.get(q, ())
        best, source, since = 0, "", 0
        for r, (last_chunk, done) in prefilled.items():
            prompt_len = trace.prompt_lens[r]
            if r == q or done >= step or r in preempted or r in loaded or len(prompt_q) < prompt_len:
                continue
            if any(last_chunk <= e <= step for e in evicted) or any(last_chunk < t <= step for t in resets):
                continue
            if prompt_q[:prompt_len] != trace.prompts.get(r):
                continue
            expected = prompt_checkpoint(prompt_len, trace.hit_alignment, trace.eagle_block_drop)
            if expected > attention_kept(trace, prompt_len):
                continue  # the attention groups' full blocks stop short of it: no bound
            if expected > best:
                best, source, since = expected, r, last_chunk
        if a.local_hit_tokens < best:
            served = a.local_hit_tokens
            return MissedHit(
                f"step {step}: {q} was served a prefix hit of {served} tokens, but {source}'s prompt "
                f"({trace.prompt_lens[source]} tokens, a prefix of {q}'s) left its checkpoint at {best} tokens "
                f"in the cache at step {since}, and no cached block was evicted since "
                f"(alignment {trace.hit_alignment}{', EAGLE block drop' if trace.eagle_block_drop else ''})",
                location="below-prompt-checkpoint", step=step, request_id=q,
                mechanism="zero-hit" if served == 0 else "short-hit",
            )
    return None


# ---- the capacity contract -------------------------------------------------------------------
def _queue(trace: Trace, step: int) -> str:
    """The engine core's batch queue at `step`, for the mechanism: synchronous, or async with a
    batch in flight (the scheduler has scheduled past outputs it has not applied) or none."""
    if not trace.async_scheduling:
        return "sync"
    event = trace.batches.get(step)
    return "async-in-flight" if event is not None and event.in_flight else "async-idle"


def _capacity(trace: Trace, nocache: bool) -> Finding | None:
    prefix, tag = ("prefix caching off: ", "nocache-") if nocache else ("", "")
    if not trace.group_reserves or trace.num_blocks < trace.startup_min_blocks:
        return None  # vLLM would not start on this pool: it promised nothing
    promise = (f"vLLM's start-up check accepts this pool ({trace.num_blocks} blocks, at least "
               f"{trace.startup_min_blocks}) as holding one request of max_model_len alone")
    alone_after: dict[int, str] = {}
    for step, rid, held in trace.alone:
        alone_after[step] = rid
        for group, (h, reserve) in enumerate(zip(held, trace.group_reserves)):
            if h > reserve:
                kind = trace.group_kinds[group] if group < len(trace.group_kinds) else "group"
                return CapacityBreach(
                    f"{prefix}step {step}: {rid}, the only request holding blocks, holds {h} blocks in KV-cache "
                    f"group {group} ({kind}) where the start-up check reserved {reserve}: {promise}",
                    location=f"{tag}held-over-reserve/{kind}",
                    step=step, request_id=rid, mechanism=_queue(trace, step),
                )
    # a reset_prefix_cache(reset_running_requests=True) preempts every running request by request, not for
    # want of blocks (scheduler.py:2850-2861); the next SchedulerOutput reports it as preempted
    forced_at = {r.step: r.preempted for r in trace.resets if r.preempted}
    forced: set[str] = set()
    for rec in trace.steps:
        if forced_at:
            forced.update(forced_at.get(rec.step, ()))
        for rid in rec.preempted:
            if rid in forced:
                forced.discard(rid)
                continue
            if alone_after.get(rec.step - 1) == rid:
                return CapacityBreach(
                    f"{prefix}step {rec.step}: {rid} was preempted while it was the only request holding blocks: "
                    f"{promise}",
                    location=f"{tag}preempted-alone", step=rec.step, request_id=rid,
                    mechanism=_queue(trace, rec.step),
                )
    return None


def check_capacity(trace: Trace, uncached: Trace | None = None) -> Finding | None:
    """vLLM's start-up check (vllm/v1/core/kv_cache_utils.py `get_kv_cache_configs`, which charges
    each KV-cache group cdiv(`max_memory_usage_bytes`, page size) whole blocks, padding included, and
    holds the null block back: `_max_memory_usage_bytes_from_groups`) admits a pool only if it holds one
    request of max_model_len tokens alone. So a request that is the only one holding blocks never
    holds more blocks in a KV-cache group than its spec's `max_memory_usage_bytes` over its page
    size (attention: cdiv(max_model_len, block_size); mamba in align mode: 2 + speculative +
    checkpoint blocks, `MambaSpec.max_memory_usage_bytes`), and is never preempted (it would be
    preempting itself, vllm-project/vllm#56028). "Alone": its tables hold every block in use, so
    a step where vLLM still holds a freed request's blocks back (`Scheduler.deferred_frees`,
    v1/core/sched/scheduler.py:186-192, 410-417) is not one. Judged on both runs (prefix caching off promises
    the same), on pools vLLM would start with only."""
    return (_capacity(trace, False) or _over_estimate(trace, False)
            or (_capacity(uncached, True) or _over_estimate(uncached, True) if uncached is not None else None))


def _over_estimate(trace: Trace, nocache: bool) -> Finding | None:
    """An allocation took more blocks than `allocate_slots` checked were free for it
    (SchedulerSession._watch_estimates: the estimate is the only capacity check, and nothing frees
    between it and the allocation, kv_cache_manager.py:561-600): a block no admission saw."""
    if not trace.over_estimates:
        return None
    prefix, tag = ("prefix caching off: ", "nocache-") if nocache else ("", "")
    step, rid, estimated, taken = trace.over_estimates[0]
    return CapacityBreach(
        f"{prefix}step {step}: allocate_slots for {rid} checked that {estimated} block(s) were free for it and "
        f"took {taken}: on a pool with exactly {estimated} free, get_new_blocks raises inside schedule()",
        location=f"{tag}allocation-over-estimate", step=step, request_id=rid, mechanism=_queue(trace, step))


# ---- the pool's accounting -----------------------------------------------------------------
def _pool(trace: Trace, nocache: bool) -> Finding | None:
    prefix, tag = ("prefix caching off: ", "nocache-") if nocache else ("", "")
    for step, free, unreferenced, negative in trace.pool:
        if negative:
            return PoolAccounting(f"{prefix}step {step}: {negative} block(s) have a negative reference count",
                                  location=f"{tag}negative-ref-count", step=step)
        if free != unreferenced:  # unreferenced never counts the null block, so it is at most num_blocks - 1
            return PoolAccounting(
                f"{prefix}step {step}: the pool reports {free} free blocks but {unreferenced} of its "
                f"{trace.num_blocks - 1} usable blocks have no reference",
                location=f"{tag}free-count", step=step)
        mismatch = trace.ref_mismatches.get(step)
        if mismatch is not None:
            block, count, held, deferred = mismatch
            where = "held-but-unreferenced" if count < held + deferred else "unowned-reference"
            return PoolAccounting(
                f"{prefix}step {step}: block {block} has a reference count of {count}, but {held} request "
                f"table entr{'y' if held == 1 else 'ies'} and {deferred} deferred free(s) hold it"
                + (" (a block in use that the pool may hand out again)" if where == "held-but-unreferenced"
                   else " (a reference nothing holds: a leak)"),
                location=f"{tag}ref-conservation/{where}", step=step)
    ended = trace.crash is None and not trace.timed_out and not trace.hit_bound and not trace.unfinished
    if ended and trace.held_at_end:
        return PoolAccounting(f"{prefix}the run ended with every request done, and {', '.join(trace.held_at_end)} "
                              "still hold blocks", location=f"{tag}held-at-end", step=len(trace.steps),
                              request_id=trace.held_at_end[0])
    if ended and trace.pool and trace.pool[-1][1] != trace.num_blocks - 1:
        step, free = trace.pool[-1][:2]
        return PoolAccounting(f"{prefix}the run ended with every request done and {free} of "
                              f"{trace.num_blocks - 1} usable blocks free", location=f"{tag}leaked-at-end", step=step)
    if ended and trace.request_state_at_end:
        where, rid = trace.request_state_at_end[0]
        more = len(trace.request_state_at_end) - 1
        return PoolAccounting(f"{prefix}the run ended with every request done, and {rid} still has an entry in {where}"
                              + (f" ({more} more entr{'y' if more == 1 else 'ies'} left)" if more else "")
                              + ": vLLM drops a request's per-request state when it frees the request",
                              location=f"{tag}request-state-at-end", step=len(trace.steps), request_id=rid,
                              mechanism=where)
    return None


def check_pool_accounting(trace: Trace, uncached: Trace | None = None) -> Finding | None:
    """The block pool's counts (vllm/v1/core/block_pool.py): after every step the free count
    (`get_num_free_blocks`, the free queue's counter) equals the blocks other than the null block
    with no reference (free_blocks queues a block when its count reaches 0; `touch` and
    get_new_blocks take it out), no count is negative, and once every request is done no request
    holds a block and every block but the null block is free (vLLM's tests assert the same at the
    end of theirs: tests/v1/core/test_prefix_caching.py, `get_num_free_blocks() == num_blocks - 1`),
    and no freed request is left in the manager's per-request state (`request-state-at-end`, the
    mechanism names the container: tests/v1/core/test_deferred_block_free.py asserts a freed
    request is gone from every manager's `req_to_blocks`; SchedulerSession.request_state_left)."""
    return _pool(trace, False) or (_pool(uncached, True) if uncached is not None else None)
