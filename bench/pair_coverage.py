"""How often the generator's executions draw two dimensions together (issue #34, "drawing
dimensions together"): a bug that needs two of them is found only as often as the pair occurs.

    python bench/pair_coverage.py [N=600] [--first-seed S] [--rarest K] [--json FILE]

Draws N scenarios as the random generator does (`random_scenario(random.Random(seed))`, seeds
S..S+N-1; invalid ones skipped, as the fuzzer skips them), runs each once with prefix caching (the
harness's cached run, no oracle), and marks each execution with the dimensions it has: a knob at a
non-default value (from the scenario) or an event that happened (from the trace: a preemption of a
request that had produced output, a partial prefix hit, an async load that finished, a checkpoint
write, ...). Prints each dimension's share of executions, then the pairs: how many of all possible
pairs occurred at least once, how many occurred in under 1% of executions, and the K rarest. A
pair with a 0.2% share is drawn about once in 500 executions: a 120-second PR job (about 2,000 to
4,000 executions) sees it a handful of times, and a bug that needs a third condition as well, rarely.
The dimensions are generic (knobs and scheduler events), not the trigger of any one bug. Nothing is
asserted; the figures go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from mambafuzz.model.architectures import DEFAULT_MODEL
from mambafuzz.model.scenario import ScenarioError, min_pool_blocks, validate


def _pool_near_floor(s) -> bool:
    return s.engine.num_gpu_blocks is not None and s.engine.num_gpu_blocks <= min_pool_blocks(s) + 8


# The knobs at a non-default value: what the scenario asks for (name, test on the scenario)
KNOBS: tuple[tuple[str, Callable], ...] = (
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


def knob_dimensions(s) -> set[str]:
    return {name for name, has in KNOBS if has(s)}


def event_dimensions(s, trace) -> set[str]:
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("n", type=int, nargs="?", default=600, help="scenarios to draw (default 600)")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--rarest", type=int, default=25, help="rarest pairs to list (default 25)")
    ap.add_argument("--json", type=Path, help="also write every dimension's and pair's count here")
    args = ap.parse_args(argv)
    if args.n < 1 or args.rarest < 0:
        print("pair_coverage: N must be at least 1 and --rarest at least 0", file=sys.stderr)
        return 2
    from mambafuzz.model.generate import random_scenario
    from mambafuzz.sim.engine import harness  # imports vLLM: after the arguments are checked

    dims: Counter[str] = Counter()
    pairs: Counter[tuple[str, str]] = Counter()
    runs = skipped = 0
    t0 = time.monotonic()
    for seed in range(args.first_seed, args.first_seed + args.n):
        s = random_scenario(random.Random(seed))
        try:
            validate(s)
        except ScenarioError:
            skipped += 1
            continue
        trace = harness.run(s)
        have = sorted(knob_dimensions(s) | event_dimensions(s, trace))
        runs += 1
        dims.update(have)
        pairs.update(itertools.combinations(have, 2))
        if runs % 100 == 0:
            print(f"[{time.monotonic() - t0:6.1f}s] {runs} executions", file=sys.stderr)
    if not runs:
        print("pair_coverage: every drawn scenario was invalid; nothing measured", file=sys.stderr)
        return 1
    names = sorted(dims)
    absent = sorted(({name for name, _ in KNOBS} | set(EVENTS)) - set(names))
    print(f"{runs} executions ({skipped} invalid draws skipped), seeds {args.first_seed}.."
          f"{args.first_seed + args.n - 1}, {time.monotonic() - t0:.0f} s")
    print("\nshare of executions with each dimension:")
    for name in sorted(names, key=lambda n: -dims[n]):
        print(f"  {name:34s} {dims[name]:6d}  {100 * dims[name] / runs:5.1f}%")
    if absent:
        print(f"  never: {', '.join(absent)}")
    possible = list(itertools.combinations(names, 2))
    seen = [p for p in possible if pairs[p]]
    rare = [p for p in seen if pairs[p] < runs / 100]
    print(f"\npairs of the {len(names)} dimensions seen at least once: {len(possible)} possible, "
          f"{len(seen)} seen, {len(possible) - len(seen)} never, {len(rare)} in under 1% of executions")
    print(f"\nthe {args.rarest} rarest pairs seen (count, share):")
    for p in sorted(seen, key=lambda p: (pairs[p], p))[:args.rarest]:
        print(f"  {pairs[p]:5d}  {100 * pairs[p] / runs:5.2f}%  {p[0]} + {p[1]}")
    never = [p for p in possible if not pairs[p]]
    if never:
        print("\npairs never seen:")
        for p in never:
            print(f"  {p[0]} + {p[1]}")
    if args.json:
        args.json.write_text(json.dumps({
            "executions": runs, "first_seed": args.first_seed, "n": args.n,
            "dimensions": {name: dims[name] for name in sorted({n for n, _ in KNOBS} | set(EVENTS))}, "pairs": {f"{a} + {b}": c for (a, b), c in sorted(pairs.items())}},
            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
