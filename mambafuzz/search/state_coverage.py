"""State coverage: which knobs an input set and which scheduler events its run reached, and the
pairs of them it drew together.

Code coverage says which lines of vLLM ran; it does not say that a preemption of a request that
had produced output happened under spec decoding, and a bug that needs both is found only as
often as the pair occurs (issue #34, "drawing dimensions together"). AFLNet keeps inputs that
reach a new protocol state; the `pairs` generator (mambafuzz.search.pairs_worker) keeps inputs
that reach a new dimension or pair of dimensions here, and bench/pair_coverage.py counts how
often each pair occurs. The dimensions are generic: a knob at a non-default value (read from the
scenario) or an event that happened (read from the cached run's trace), never the trigger of one
bug. Pure functions over a Scenario and a Trace.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from mambafuzz.model.architectures import DEFAULT_MODEL
from mambafuzz.model.scenario import Scenario, min_pool_blocks
from mambafuzz.sim.trace import Trace


def _pool_near_floor(s: Scenario) -> bool:
    return s.engine.num_gpu_blocks is not None and s.engine.num_gpu_blocks <= min_pool_blocks(s) + 8


# The knobs at a non-default value: what the scenario asks for (name, test on the scenario)
KNOBS: tuple[tuple[str, Callable[[Scenario], bool]], ...] = (
    ("knob:spec-decode", lambda s: s.engine.uses_spec_decode),
    # unset is vLLM's default, async (target_runtime counts it so): the knob's other value is sync
    ("knob:sync-scheduling", lambda s: s.engine.async_scheduling is False),
    ("knob:runner-v1", lambda s: s.engine.runner == "v1"),
    ("knob:fine-match-unit", lambda s: bool(s.engine.prefix_match_unit)
     and s.engine.prefix_match_unit < s.engine.mamba_block_size),
    ("knob:prefill-checkpoints", lambda s: bool(s.engine.num_prefill_checkpoint_blocks)),
    ("knob:connector-sync", lambda s: any(r.external_tokens and not r.external_async for r in s.requests)),
    ("knob:connector-async", lambda s: any(r.external_tokens and r.external_async for r in s.requests)),
    ("knob:connector-save", lambda s: bool(s.engine.connector_save)),
    ("knob:connector-slow-recv", lambda s: s.engine.connector_recv_steps > 0),
    ("knob:connector-failed-load", lambda s: s.engine.connector_failed_load > 0),
    ("knob:pool-drawn", lambda s: s.engine.num_gpu_blocks is not None),
    ("knob:pool-near-floor", _pool_near_floor),
    ("knob:priority-policy", lambda s: s.engine.scheduling_policy == "priority"),
    ("knob:continuations", lambda s: any(r.continues is not None for r in s.requests)),
    ("knob:aborts", lambda s: any(r.abort_step is not None for r in s.requests)),
    ("knob:other-model", lambda s: s.engine.model != DEFAULT_MODEL),
    ("knob:long-prefill-threshold", lambda s: bool(s.engine.long_prefill_token_threshold)),
    ("knob:several-requests", lambda s: len(s.requests) >= 2),
)
# The scheduler events a run can have (event_dimensions): what the scenario reached
EVENTS = ("event:preempted-with-output", "event:preempted-in-prefill", "event:prefix-hit", "event:partial-hit",
          "event:connector-load", "event:async-load-finished", "event:spec-row", "event:mid-block-resume",
          "event:checkpoint-write", "event:cow-write", "event:abort", "event:lru-eviction",
          "event:continuation-hit")
ALL_DIMENSIONS = tuple(name for name, _ in KNOBS) + EVENTS


def knob_dimensions(s: Scenario) -> set[str]:
    return {name for name, has in KNOBS if has(s)}


def event_dimensions(s: Scenario, trace: Trace) -> set[str]:
    """The scheduler events the run had: what the scenario reached."""
    block = s.engine.mamba_block_size
    prompt = {rid: len(tokens) for rid, tokens in trace.prompts.items()}
    produced: set[str] = set()  # requests that had run a row to the end of their prompt: they sampled
    found: set[str] = set()
    for rec in trace.steps:
        for rid in rec.preempted:
            found.add("event:preempted-with-output" if rid in produced else "event:preempted-in-prefill")
        for a in rec.admissions:
            if a.local_hit_tokens:
                found.add("event:prefix-hit")
                if a.local_hit_tokens % block:
                    found.add("event:partial-hit")
            if a.external_tokens:
                found.add("event:connector-load")
        if rec.recv_done:
            found.add("event:async-load-finished")
        for c in rec.chunks:
            if c.num_drafts:
                found.add("event:spec-row")
            if c.resumed_from_hit and c.start % block:
                found.add("event:mid-block-resume")
            if c.start + c.num_tokens - c.num_drafts >= prompt.get(c.request_id, 1 << 30):  # it sampled
                produced.add(c.request_id)
        for w in rec.writes:
            if w.cause in ("checkpoint", "cow"):
                found.add(f"event:{w.cause}-write")
        if rec.aborts:
            found.add("event:abort")
    if trace.lru_evictions:
        found.add("event:lru-eviction")
    if trace.continuations and any(a.local_hit_tokens and a.request_id in trace.continuations
                                   for rec in trace.steps for a in rec.admissions):
        found.add("event:continuation-hit")
    return found


def dimensions(s: Scenario, trace: Trace) -> tuple[str, ...]:
    """The run's dimensions, sorted: its knobs and the events its cached run reached."""
    return tuple(sorted(knob_dimensions(s) | event_dimensions(s, trace)))


def pairs(dims: Iterable[str]) -> list[tuple[str, str]]:
    """Every pair of `dims` (sorted first, so a pair is always named the same way)."""
    return list(itertools.combinations(sorted(dims), 2))


def features(dims: Iterable[str]) -> frozenset:
    """What the `pairs` generator counts as coverage: each dimension and each pair of them."""
    dims = tuple(dims)
    return frozenset(dims) | frozenset(pairs(dims))
