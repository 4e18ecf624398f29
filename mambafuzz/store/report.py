"""Human and machine renderings of verdicts and traces."""

from __future__ import annotations

import hashlib
from typing import Any

from mambafuzz.sim.trace import Trace


def describe(path: str, split: str, ev, expected: str | None) -> dict[str, Any]:
    v = ev.verdict
    return {
        "file": str(path),
        "split": split,
        "verdict": v.kind,
        "findings": [f.to_json() for f in v.findings],
        "reports": [f.to_json() for f in v.reports],
        "expected": expected,
        "matches_expected": None if expected is None else expected == v.kind,
        "steps": len(ev.trace.steps),
        "forward_steps": ev.trace.forward_steps,
        "hashed_snapshots": ev.trace.hashed_snapshots,
        "prefix_hit_tokens": ev.trace.prefix_hit_tokens,
    }


def step_table(trace: Trace) -> str:
    """One block per step: arrivals/admissions, each chunk, slot writes, newly hashed blocks."""
    mode = (f"AsyncScheduler, {trace.batch_queue_depth} batches in flight" if trace.async_scheduling
            else "Scheduler, one batch at a time")
    lines = [f"model {trace.model}"] if trace.model else []
    lines += [f"model runner {trace.runner or '?'}, mixer {trace.mixer or '?'}, prefix caching "
             f"{'on (mamba_cache_mode align)' if trace.prefix_caching else 'off (mamba_cache_mode none)'}, {mode}",
             f"{'step':>4}  {'what':<10} detail"]
    connector: dict[int, list[tuple[str, str]]] = {}
    for step, what, rid, detail in trace.connector_events:
        connector.setdefault(step, []).append((what, f"{rid} {detail}"))
    resets = {r.step: r for r in trace.resets}
    for rec in trace.steps:
        rows: list[tuple[str, str]] = []
        event = trace.batches.get(rec.step)
        if rec.arrivals:
            rows.append(("arrive", " ".join(rec.arrivals)))
            for rid in rec.arrivals:
                if rid in trace.continuations:
                    earlier, n, _ = trace.continuations[rid]
                    rows.append(("continue", f"{rid} continues {earlier} (+{n} generated tokens; prompt "
                                             f"{trace.prompt_lens.get(rid, '?')} tokens)"))
        if rec.aborts:
            rows.append(("abort", " ".join(rid + (" (arrived in flight: before update_from_output)"
                                                   if (rec.step, rid) in trace.in_flight_aborts else "")
                                           for rid in rec.aborts)))
        reset = resets.get(rec.step)
        if reset is not None:
            how = "reset_running_requests=True" if reset.reset_running_requests else "running requests kept"
            rows.append(("reset", f"reset_prefix_cache ({how}) -> {reset.succeeded}; {reset.keys_before} keys before, "
                                  f"{len(reset.keys_left)} after"
                                  + (f"; preempted {' '.join(reset.preempted)}" if reset.preempted else "")))
        if event is not None and event.scheduled is not None:
            rows.append(("schedule", f"batch {event.scheduled} ({event.in_flight} in flight); its forward runs now"))
            for block in event.published:
                rows.append(("publish", f"block {block} keyed by schedule() (batch {event.scheduled})"))
        for a in rec.admissions:
            ext = f" + connector {a.external_tokens}{' async' if a.external_async else ''}" if a.external_tokens else ""
            rows.append(("admit", f"{a.request_id} local hit {a.local_hit_tokens}{ext}"))
        for c in rec.chunks:
            drafts = f" (+{c.num_drafts} drafts)" if c.num_drafts else ""
            mark = "" if c.read_state == c.true_state else f"  <-- expected {c.true_state}"
            path = ""  # which kernel ran the row; only a spec-decode engine has two to choose from
            if trace.spec_rows:
                path = " [spec kernel]" if (rec.step, c.request_id) in trace.spec_rows else " [prefill kernel]"
            rows.append(("chunk", f"{c.request_id} {c.start}->{c.end}{drafts}{path} reads slot {c.read_column} "
                                  f"(block {c.read_block}) {c.read_state}{mark}"))
        for w in rec.writes:
            who = "" if w.request_id == "-" else f"{w.request_id} "
            slot = f"slot {w.column} " if w.column >= 0 else ""
            rows.append(("write", f"{who}{slot}block {w.block_id} <- {w.state} [{w.cause}]"))
        for e in rec.cache:
            if e.new or e.held != e.claimed:
                mark = "" if e.held == e.claimed else "  <-- POISONED"
                rows.append(("hashed" if e.new else "cached",
                             f"block {e.block_id} claims {e.claimed} of {e.claimed_by}, holds {e.held}{mark}"))
        for rid in rec.preempted:
            rows.append(("preempt", rid))
        if event is not None and event.applied is not None:
            rows.append(("apply", f"batch {event.applied}'s output (update_from_output)"))
            for block in event.published_on_update:
                rows.append(("publish", f"block {block} keyed by update_from_output (batch {event.applied})"))
        for rid in rec.finished:
            rows.append(("finish", f"{rid} {trace.finish_status.get(rid, '')}"))
        rows += connector.get(rec.step, ())
        for i, (what, detail) in enumerate(rows):
            lines.append(f"{rec.step if i == 0 else '':>4}  {what:<10} {detail}")
    if trace.crash:
        lines.append(f"crash at step {trace.crash.step}: {trace.crash.exc_type}: {trace.crash.message}")
    return "\n".join(lines)


def trace_digest(trace: Trace) -> str:
    """A digest of everything the trace recorded, in order: equal digests mean the runs
    scheduled, wrote, published and generated exactly the same things."""
    h = hashlib.sha256()
    for rec in trace.steps:
        h.update(repr(rec).encode())
    h.update(repr((sorted(trace.outputs.items()), sorted(trace.finish_status.items()), trace.unfinished,
                   trace.hit_bound, trace.crash)).encode())
    if trace.batches:  # async scheduling only, so a synchronous run's digest is what it always was
        h.update(repr(sorted(trace.batches.items())).encode())
    if trace.in_flight_aborts:
        h.update(repr(sorted(trace.in_flight_aborts)).encode())
    if trace.connector_events:  # saving / multi-step / failing connectors only
        h.update(repr(trace.connector_events).encode())
    if trace.continuations:  # only runs with continuations, so other digests are what they were
        h.update(repr(sorted(trace.continuations.items())).encode())
    if trace.resets:  # only runs with prefix-cache resets
        h.update(repr(trace.resets).encode())
    return h.hexdigest()[:32]
