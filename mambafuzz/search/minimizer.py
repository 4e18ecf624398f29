"""Shrink a failing scenario while it keeps failing the same way (same signature).

Greedy passes in the Hypothesis style: structural deletions first (requests, prefixes,
steps), then the whole geometry scaled down (mambafuzz.model.geometry: the smallest mamba block
that keeps the signature, every length with it, so findings of one cause share a geometry),
then the engine config simplified field by field, then each integer shrunk towards its
simplest value by halving.  A candidate is kept only if it is valid, strictly
smaller by `complexity`, and still produces the target signature.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Iterator

from mambafuzz.model import geometry
from mambafuzz.model.scenario import EngineConfig, Scenario, ScenarioError, knobs, validate

Predicate = Callable[[Scenario], bool]
_DEFAULT_ENGINE = EngineConfig()


def complexity(s: Scenario) -> tuple:
    """Smaller is simpler: requests, then tokens, then steps, then config knobs away from default."""
    requests, steps, tokens = s.size()
    e = s.engine
    knobs = sum(getattr(e, f.name) != getattr(_DEFAULT_ENGINE, f.name) for f in dataclasses.fields(e))
    extras = sum(bool(r.external_tokens) + (r.abort_step is not None) + r.external_async + r.abort_in_flight
                 + (r.continues is not None) + bool(r.connector_defer) for r in s.requests)
    extras += sum(1 + r.reset_running_requests for r in s.prefix_cache_resets)
    return (requests, tokens, steps, len(s.prefixes), extras, knobs, len(s.acceptance), s.token_seed,
            e.mamba_block_size, e.max_num_batched_tokens, e.num_speculative_tokens, e.max_num_seqs,
            e.long_prefill_token_threshold, sum(s.acceptance), sum(r.step for r in s.prefix_cache_resets))


def _drop_requests(s: Scenario) -> Iterator[Scenario]:
    """Each request dropped; a continuation of it then continues what it continued (or nothing)."""
    for i in range(len(s.requests) - 1, -1, -1):
        if len(s.requests) > 1:
            c = copy.deepcopy(s)
            dropped = c.requests.pop(i)
            for r in c.requests:
                if r.continues == i:
                    r.continues = dropped.continues
                    if r.continues is None:
                        _unlink(r)
                elif r.continues is not None and r.continues > i:
                    r.continues -= 1
            yield c


def _unlink(r) -> None:
    """`r` no longer continues anything: an ordinary request with its own tail (at least one token)."""
    r.continues = r.continue_outputs = None
    r.unique_len = max(r.unique_len, 1)


def _drop_links(s: Scenario) -> Iterator[Scenario]:
    """Each continuation made an ordinary request (its own tail only, at least one token)."""
    for i, r in enumerate(s.requests):
        if r.continues is not None:
            c = copy.deepcopy(s)
            _unlink(c.requests[i])
            yield c


def _drop_resets(s: Scenario) -> Iterator[Scenario]:
    """Each prefix-cache reset dropped, then each reset that preempts the running requests made one that
    keeps them (it may then fail: the cache left as it was)."""
    for i in range(len(s.prefix_cache_resets) - 1, -1, -1):
        c = copy.deepcopy(s)
        del c.prefix_cache_resets[i]
        yield c
    for i, r in enumerate(s.prefix_cache_resets):
        if r.reset_running_requests:
            c = copy.deepcopy(s)
            c.prefix_cache_resets[i].reset_running_requests = False
            yield c


def _drop_prefixes(s: Scenario) -> Iterator[Scenario]:
    for p in range(len(s.prefixes) - 1, -1, -1):
        c = copy.deepcopy(s)
        del c.prefixes[p]
        for r in c.requests:
            r.prefix_ids = [x - (x > p) for x in r.prefix_ids if x != p]
        yield c
    for i, r in enumerate(s.requests):
        for j in range(len(r.prefix_ids)):
            c = copy.deepcopy(s)
            del c.requests[i].prefix_ids[j]
            yield c


def _shrink_int(value: int, lo: int) -> Iterator[int]:
    """lo first, then values closing in on `value` from below by halving the gap."""
    if value <= lo:
        return
    yield lo
    gap = (value - lo) // 2
    while gap > 0:
        yield value - gap
        gap //= 2


def _int_fields(s: Scenario) -> Iterator[tuple[Callable[[Scenario], object], str, int, int]]:
    """(getter of the object holding the field, field name, current value, simplest value)."""
    for i, r in enumerate(s.requests):
        def req(c, i=i):
            return c.requests[i]
        yield req, "unique_len", r.unique_len, 0 if r.continues is not None else 1
        if r.continue_outputs is not None:
            yield req, "continue_outputs", r.continue_outputs, 0
        yield req, "max_tokens", r.max_tokens, 1
        yield req, "arrival_step", r.arrival_step, 0
        yield req, "external_tokens", r.external_tokens, 0
        if r.abort_step is not None:
            yield req, "abort_step", r.abort_step, r.arrival_step
        if r.priority:
            yield req, "priority", r.priority, 0
        if r.connector_defer:
            yield req, "connector_defer", r.connector_defer, 0
    for p, length in enumerate(s.prefixes):
        yield (lambda c: c.prefixes), p, length, 1
    for i, r in enumerate(s.prefix_cache_resets):  # earlier, down to just after the reset before it
        def reset(c, i=i):
            return c.prefix_cache_resets[i]
        yield reset, "step", r.step, s.prefix_cache_resets[i - 1].step + 1 if i else 0
    def eng(c):
        return c.engine
    for name, k in knobs().items():
        if k.kind == "int" and k.shrink and not k.optional and k.simplest is not None:
            yield eng, name, getattr(s.engine, name), k.simplest
    yield (lambda c: c), "token_seed", s.token_seed, 0


def _set(obj, name, value) -> None:
    if isinstance(obj, list):
        obj[name] = value
    else:
        setattr(obj, name, value)


def _with_engine_value(s: Scenario, name: str, value: object) -> Scenario:
    """A copy with engine knob `name` set to `value`, its declared companions set with it when
    that is its simplest value, and the acceptance table dropped once nothing is speculated."""
    c = copy.deepcopy(s)
    setattr(c.engine, name, value)
    k = knobs()[name]
    if value == k.simplest:
        for other, other_value in k.companions:
            setattr(c.engine, other, other_value)
    if not c.engine.uses_spec_decode:
        c.acceptance = []
    return c


def _shrink_numbers(s: Scenario) -> Iterator[Scenario]:
    for getter, name, value, lo in _int_fields(s):
        for v in _shrink_int(value, lo):
            if getter(s) is s.engine:
                yield _with_engine_value(s, name, v)
                continue
            c = copy.deepcopy(s)
            _set(getter(c), name, v)
            yield c


def _simplify_engine(s: Scenario) -> Iterator[Scenario]:
    e = s.engine
    for name, k in knobs().items():  # switches, choices and optional knobs go straight to their simplest
        if (k.kind != "int" or k.optional) and getattr(e, name) != k.simplest:
            yield _with_engine_value(s, name, k.simplest)
    for r_i, r in enumerate(s.requests):
        if r.abort_step is not None:
            c = copy.deepcopy(s)
            c.requests[r_i].abort_step = None
            c.requests[r_i].abort_in_flight = False
            yield c
        if r.abort_in_flight:
            c = copy.deepcopy(s)
            c.requests[r_i].abort_in_flight = False
            yield c
        if r.external_async:
            c = copy.deepcopy(s)
            c.requests[r_i].external_async = False
            yield c
    if s.acceptance:
        c = copy.deepcopy(s)
        c.acceptance = []
        yield c
    # Smaller blocks, keeping the attention block a divisor (and a multiple of 8 for mamba).
    for k in (1, 2, 4):
        mamba = e.attn_block_size * k
        if mamba < e.mamba_block_size and mamba % 8 == 0:
            c = copy.deepcopy(s)
            c.engine.mamba_block_size = mamba
            yield c


def _scale_geometry(s: Scenario) -> Iterator[Scenario]:
    """The scenario on each smaller mamba block, smallest first, every declared length scaled with it."""
    for size in geometry.smaller_blocks(s.engine.mamba_block_size):
        yield geometry.scaled(s, size)


PASSES = (_drop_requests, _drop_links, _drop_resets, _drop_prefixes, _scale_geometry, _simplify_engine, _shrink_numbers)


@dataclasses.dataclass
class MinimizeResult:
    scenario: Scenario
    attempts: int
    accepted: int
    seconds: float
    timed_out: bool


def minimize(scenario: Scenario, still_fails: Predicate, time_budget: float = 30.0,
             max_attempts: int = 5000) -> MinimizeResult:
    """Greedy fixpoint over PASSES; `still_fails` runs the candidate and checks its signature."""
    best = scenario
    attempts = accepted = 0
    start = time.monotonic()
    improved = True
    while improved:
        improved = False
        for make in PASSES:
            progress = True
            while progress:
                progress = False
                for cand in make(best):
                    if time.monotonic() - start > time_budget or attempts >= max_attempts:
                        return MinimizeResult(best, attempts, accepted, time.monotonic() - start, True)
                    if validate(cand) or complexity(cand) >= complexity(best):
                        continue
                    attempts += 1
                    try:
                        ok = still_fails(cand)
                    except ScenarioError:
                        ok = False
                    if ok:
                        best, accepted = cand, accepted + 1
                        progress = improved = True
                        break
    return MinimizeResult(best, attempts, accepted, time.monotonic() - start, False)
