"""Replay a scenario through a real vLLM engine, cached vs uncached, and compare.

Why: the harness proves a split publishes a wrong mamba state under its kernel model; the
engine tier checks that the real model runner and kernels agree, i.e. that greedy outputs
with prefix caching on (align mode, the split under test) equal those with it off.  It also
records what the real engine scheduled each step and compares it with the harness's trace
of the same scenario, which validates the harness's view of the scheduler.

Finding kinds: `engine_divergence` (tokens differ, or logprobs beyond LOGPROB_TOL) and
`engine_crash` (vLLM raised while serving, or a request never finished).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mambafuzz.engine_tier import engines
from mambafuzz.model.scenario import Scenario
from mambafuzz.model.step_plan import DONE, StepPlan

# Cached and uncached runs cut prefills at different offsets and batch differently, and the
# model computes in bf16, so the same position's logprob moves between runs.  Measured with
# the fixed split on 70 random CPU-runnable scenarios: up to 0.3 for one token, and greedy
# flips between two tokens whose combined gap (on + off) was at most 0.37 (bf16 logits tie
# exactly at times).  A poisoned state moved the restored request's logprobs by ~1-3.  With
# these tolerances the fixed split agreed on all of 150 further random scenarios.
LOGPROB_TOL = float(os.environ.get("MAMBAFUZZ_LOGPROB_TOL", "0.5"))
# A flipped greedy token (a on, b off) is a near-tie when lp_on(a) - lp_on(b) plus
# lp_off(b) - lp_off(a) stays within TIE_TOL; the continuations then differ legitimately.
TIE_TOL = float(os.environ.get("MAMBAFUZZ_TIE_TOL", "0.5"))
TOP_K = 5  # logprobs requested per position: enough to place the other run's pick
SCENARIO_TIMEOUT = float(os.environ.get("MAMBAFUZZ_ENGINE_TIMEOUT", "300"))


@dataclass
class Replay:
    """What one engine run produced."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[float]] = field(default_factory=dict)
    # per position: the TOP_K (token, logprob) pairs, best first, to tell a near-tie from a divergence
    top: dict[str, list[list[tuple[int, float]]]] = field(default_factory=dict)
    schedule: list[dict[str, int]] = field(default_factory=list)  # per step: request -> tokens scheduled
    aborted: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    unfinished: list[str] = field(default_factory=list)
    crash: str | None = None
    steps: int = 0
    wall_s: float = 0.0


def replay(handle: engines.EngineHandle, s: Scenario, split_fn: Any = None) -> Replay:
    """Drive `s` step by step through `handle`'s engine: arrivals and aborts at their steps,
    one engine.step() per step, until every request finished (or the liveness bound)."""
    from mambafuzz.sim.bridge.vllm_compat.api import SamplingParams

    out = Replay()
    plan = StepPlan.of(s)
    handle.install_split(split_fn)
    handle.schedule_log = []
    added: list[str] = []
    t0 = time.monotonic()
    step = 0
    try:
        while True:
            end = plan.end(step, handle.engine.has_unfinished_requests())
            if end == DONE:
                break
            if end is not None or time.monotonic() - t0 > SCENARIO_TIMEOUT:
                out.unfinished = [rid for rid in added if rid not in out.aborted and not _finished(out, rid)]
                break
            for i, rid in plan.arrivals(step):
                params = SamplingParams(max_tokens=s.requests[i].max_tokens, temperature=0.0, ignore_eos=True,
                                        logprobs=TOP_K)
                handle.engine.add_request(rid, {"prompt_token_ids": s.prompt_tokens(i)}, params,
                                          priority=s.requests[i].priority)
                added.append(rid)
                out.tokens[rid], out.logprobs[rid], out.top[rid] = [], [], []
            aborts = plan.aborts(step, lambda rid: rid in added and not _finished(out, rid))
            if aborts:
                handle.engine.abort_request(aborts)
                out.aborted.update(aborts)
            before = len(handle.schedule_log)
            for o in handle.engine.step():
                _take(out, o)
            log = handle.schedule_log
            out.schedule.append({_external(k): v for k, v in log[-1].items()} if len(log) > before else {})
            step += 1
    except Exception as exc:  # vLLM raised while serving: the engine is no longer trustworthy
        from mambafuzz.sim.engine.worker_contract import vllm_frame

        out.crash = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]} at {vllm_frame(exc)} (step {step})"
    out.steps = step
    out.wall_s = time.monotonic() - t0
    if out.crash is not None:
        engines.drop_engine(handle.spec)
    else:
        handle.reset(added)
    return out


def _finished(out: Replay, rid: str) -> bool:
    return rid in out.finished


def _take(out: Replay, o: Any) -> None:
    """Fold one RequestOutput (cumulative) into the replay."""
    rid = o.request_id
    c = o.outputs[0]
    out.tokens[rid] = list(c.token_ids)
    lps, tops = [], []
    for tok, d in zip(c.token_ids, c.logprobs or []):
        lps.append(float(d[tok].logprob) if tok in d else math.nan)
        tops.append(sorted(((int(t), float(lp.logprob)) for t, lp in d.items()), key=lambda x: -x[1]))
    out.logprobs[rid], out.top[rid] = lps, tops
    if o.finished:
        out.finished.add(rid)


def _external(internal_id: str) -> str:
    """vLLM appends '-<8 random chars>' to every request id it is given."""
    return internal_id.rsplit("-", 1)[0]


# ---- comparison -----------------------------------------------------------------------

def compare(cached: Replay, uncached: Replay) -> tuple[str | None, list[str]]:
    """(the first way `cached` generated differently from `uncached` or None, near-ties seen).

    Aborted requests are compared over the tokens both runs produced (greedy: a prefix).
    After a near-tie flip a request's continuations legitimately differ: its comparison stops."""
    ties: list[str] = []
    for rid in cached.tokens:
        diff = _compare_request(cached, uncached, rid, ties)
        if diff is not None:
            return diff, ties
    return None, ties


def _compare_request(cached: Replay, uncached: Replay, rid: str, ties: list[str]) -> str | None:
    toks, other = cached.tokens[rid], uncached.tokens.get(rid, [])
    partial = rid in cached.aborted or rid in uncached.aborted
    n = min(len(toks), len(other)) if partial else max(len(toks), len(other))
    for i in range(n):
        a = toks[i] if i < len(toks) else None
        b = other[i] if i < len(other) else None
        if a != b:
            if a is not None and b is not None and _near_tie(cached, uncached, rid, i):
                ties.append(f"{rid}: token {i} is a near-tie ({a} on, {b} off); later tokens not compared")
                return None
            return (f"{rid}: token {i} is {a} with prefix caching on and {b} with it off "
                    f"(on: {toks[i:i + 4]}..., off: {other[i:i + 4]}...)")
        la, lb = cached.logprobs[rid][i], uncached.logprobs[rid][i]
        if abs(la - lb) > LOGPROB_TOL:
            return f"{rid}: token {i} ({a}) has logprob {la:.4f} with prefix caching on and {lb:.4f} off"
    return None


def _near_tie(cached: Replay, uncached: Replay, rid: str, i: int) -> bool:
    """Whether the flip at position i is within TIE_TOL (see there).  A pick missing from a
    run's top list counts as the lowest logprob listed (a lower bound on the gap)."""
    a, b = cached.tokens[rid][i], uncached.tokens[rid][i]
    total = 0.0
    for run, pick, other in ((cached, a, b), (uncached, b, a)):
        top = dict(run.top[rid][i]) if i < len(run.top[rid]) else {}
        if pick not in top:
            return False
        total += top[pick] - top.get(other, min(top.values()))
    return total <= TIE_TOL


def harness_schedule(s: Scenario, split_fn: Any, split_name: str) -> tuple[list[dict[str, int]] | None, str | None]:
    """What the harness scheduled per step for `s` (prefix caching on), or (None, why not)."""
    from mambafuzz.sim.engine import harness

    trace = harness.run(s, split_fn, split_name)
    if trace.crash is not None:
        return None, f"harness crashed: {trace.crash.exc_type} at {trace.crash.vllm_frame}"
    return [{c.request_id: c.num_tokens for c in st.chunks} for st in trace.steps], None


def schedule_diff(engine: list[dict[str, int]], harness: list[dict[str, int]]) -> str | None:
    """The first step where the two schedules differ, in words, or None. Trailing steps that
    schedule nothing are not compared: under async scheduling the engine core still drains its
    batch queue after the last request finished, which the replay (stepping while the engine has
    unfinished requests) does not wait for."""
    engine, harness = _without_trailing_idle(engine), _without_trailing_idle(harness)
    for step in range(max(len(engine), len(harness))):
        a = engine[step] if step < len(engine) else None
        b = harness[step] if step < len(harness) else None
        if a != b:
            return f"step {step}: engine scheduled {a}, harness {b}"
    return None


def _without_trailing_idle(schedule: list[dict[str, int]]) -> list[dict[str, int]]:
    end = len(schedule)
    while end and not schedule[end - 1]:
        end -= 1
    return schedule[:end]


# ---- the verdict ----------------------------------------------------------------------

def confirm(scenario: Scenario, split: str | Callable[..., int] = "fixed") -> dict[str, Any]:
    """Replay `scenario` on the CPU engine under `split` (a --split name, or the function
    itself), cached vs uncached.  A scenario only the cached engine cannot run (spec decode in
    align mode, blocks below the CPU floor) whose harness uncached run crashes or stalls is
    replayed on the uncached engine alone (`_confirm_uncached_only`).

    Returns {"status": "diverged"|"agreed"|"skipped"|"crashed", "reason", "schedule_match",
    "kind" (finding kind or None), "schedule_diff", "adapted", timings...}.  Raises
    mambafuzz.sim.engine.splits.SplitError for an unknown split name."""
    from mambafuzz.sim.engine import splits

    if callable(split):
        split_fn, split = split, getattr(split, "__name__", "custom")
    else:
        split_fn = splits.resolve(split)
    result: dict[str, Any] = {"status": "skipped", "reason": None, "kind": None, "schedule_match": None,
                              "schedule_diff": None, "split": split, "adapted": []}
    why = engines.unsupported(scenario)
    if why is not None:
        result["reason"] = why
        if engines.unsupported(scenario, prefix_caching=False) is None and _harness_uncached_fails(scenario, split_fn, split):
            _confirm_uncached_only(result, scenario, why)
        return result
    view = engines.engine_view(scenario)
    result["adapted"] = engines.adaptations(scenario)
    t0 = time.monotonic()
    try:
        cached_engine = engines.get_engine(engines.EngineSpec.for_scenario(scenario, True))
        uncached_engine = engines.get_engine(engines.EngineSpec.for_scenario(scenario, False))
    except engines.EngineStartError as exc:
        result["reason"] = str(exc)
        return result
    result["startup_s"] = round(time.monotonic() - t0, 2)
    if scenario.engine.num_gpu_blocks is None:
        for h in (cached_engine, uncached_engine):
            if not engines.ample_for_engine(scenario, h.num_blocks):
                result["reason"] = (f"the engine's pool ({h.num_blocks} blocks of {h.spec.block_size}) is not ample for "
                                    "this scenario; raise MAMBAFUZZ_ENGINE_KV_GIB")
                return result
    cached = replay(cached_engine, scenario, split_fn)
    uncached = replay(uncached_engine, scenario, None)
    result["cached"] = _summary(cached)
    result["uncached"] = _summary(uncached)
    result["replay_s"] = round(cached.wall_s + uncached.wall_s, 2)
    for label, r in (("prefix caching on", cached), ("prefix caching off", uncached)):
        if r.crash is not None:
            result.update(status="crashed", kind="engine_crash", reason=f"{label}: {r.crash}")
            break
        if r.unfinished:
            result.update(status="crashed", kind="engine_crash",
                          reason=f"{label}: stall: {', '.join(r.unfinished)} unfinished after {r.steps} steps")
            break
    else:
        diff, ties = compare(cached, uncached)
        result["near_ties"] = ties
        if diff is None:
            result.update(status="agreed", reason="cached and uncached outputs agree")
        else:
            result.update(status="diverged", kind="engine_divergence", reason=diff)
    _schedule_check(result, scenario, view, cached, split_fn, split)
    return result


def _harness_uncached_fails(s: Scenario, split_fn: Any, split: str) -> bool:
    """Whether the harness's prefix-caching-off run of `s` crashes or stalls (a `nocache-` finding)."""
    from mambafuzz.sim.engine import harness

    trace = harness.run(s, split_fn, split, prefix_caching=False)
    return trace.crash is not None or bool(trace.unfinished)


def _confirm_uncached_only(result: dict[str, Any], scenario: Scenario, why: str) -> None:
    """The cached engine cannot run `scenario` (`why`) but the harness's uncached run fails:
    replay it on the uncached engine alone, which is all such a finding needs.  A crash or a
    stall there is `crashed`; a clean run stays `skipped` (nothing was compared), saying so."""
    t0 = time.monotonic()
    try:
        handle = engines.get_engine(engines.EngineSpec.for_scenario(scenario, False))
    except engines.EngineStartError as exc:
        result["reason"] = f"{why}; the uncached engine could not start either: {exc}"
        return
    result["startup_s"] = round(time.monotonic() - t0, 2)
    if scenario.engine.num_gpu_blocks is None and not engines.ample_for_engine(scenario, handle.num_blocks):
        result["reason"] = f"{why}; the uncached engine's pool is not ample either; raise MAMBAFUZZ_ENGINE_KV_GIB"
        return
    r = replay(handle, scenario, None)
    result["uncached"] = _summary(r)
    result["replay_s"] = round(r.wall_s, 2)
    result["schedule_note"] = "cached run not replayed: schedules not compared"
    not_cached = f"the cached run was not replayed: {why.split(':')[0]}"
    if r.crash is not None:
        result.update(status="crashed", kind="engine_crash", reason=f"prefix caching off: {r.crash}; {not_cached}")
    elif r.unfinished:
        result.update(status="crashed", kind="engine_crash", reason=(
            f"prefix caching off: stall: {', '.join(r.unfinished)} unfinished after {r.steps} steps; {not_cached}"))
    else:
        result["reason"] = f"{why}; the uncached run alone finished cleanly although the harness's crashes or stalls"


def _schedule_check(result: dict[str, Any], scenario: Scenario, view: Scenario, cached: Replay,
                    split_fn: Any, split: str) -> None:
    """Compare the engine's per-step schedule with the harness's trace of the same scenario
    (`view`: as the engine ran it). The harness builds the engine's KV-cache groups and retention,
    so a mismatch is a bug in the harness or the kernel model."""
    if cached.crash is not None:
        result["schedule_note"] = "engine crashed: schedules not compared"
        return
    sched, why = harness_schedule(view, split_fn, split)
    if sched is None:
        result["schedule_note"] = why
        return
    diff = schedule_diff(cached.schedule, sched)
    result["schedule_match"] = diff is None
    result["schedule_diff"] = diff
    if diff is not None:
        result["schedule_note"] = "UNEXPLAINED: the harness schedules this scenario differently from the engine"
    if result["adapted"]:
        original, _ = harness_schedule(scenario, split_fn, split)
        result["adaptation_changes_harness_schedule"] = original != sched


def _summary(r: Replay) -> dict[str, Any]:
    return {"steps": r.steps, "wall_s": round(r.wall_s, 3), "tokens": r.tokens,
            "aborted": sorted(r.aborted), "crash": r.crash}
