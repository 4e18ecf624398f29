"""Benchmark: how fast is the fuzz harness, against bare vLLM scheduling and a 10k-block pool?

Run:  python bench/harness_speed.py [--reps N] [--number M] [--json]

On a fixed set of representative scenarios it measures, per scenario (median of --reps, each
rep timing --number back-to-back executions with time.perf_counter):

  bare1     one cached run of a minimal loop: the same SchedulerSession the harness builds
            (same pool: engine.num_gpu_blocks or ample_pool_blocks), the same arrivals, and
            outputs fed as a constant sampled token (spec-decode scenarios propose constant
            drafts and accept them with the scenario's acceptance pattern, so both loops take
            the same steps);
  bare2     bare1 plus the same loop with prefix caching off (what evaluate's 2 runs cost bare);
  harness1  fuzz.harness.run(scenario): one cached harness run;
  evaluate  fuzz.pipeline.evaluate(scenario, "fixed"): cached + uncached runs + oracle;
  fresh10k  evaluate with engine.num_gpu_blocks = 10000 (a fresh 10,000-block KVCacheManager
            per run, as vLLM's own CPU tests build), also fresh10k1 for a single harness run.

It prints a table and three headline figures with targets (PASS/MISS; nothing is asserted):
  a. evaluate executions per second;
  b. harness(one run)/bare and evaluate(2 runs + oracle)/bare(2 runs), target <= 1.3x;
  c. fresh10k_time / harness_time (evaluate vs evaluate), target >= 20x.
A benchmark, not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable

from fuzz import harness, pipeline
from fuzz import vllm_bridge as vb
from fuzz.scenario import EngineConfig, RequestSpec, Scenario, ample_pool_blocks, validate

CONST_TOKEN = 7  # the bare loop's sampled (and drafted) token
FRESH_BLOCKS = 10_000
TARGET_BARE_RATIO = 1.3
TARGET_FRESH_SPEEDUP = 20.0


# ---- scenarios ------------------------------------------------------------------------


def scenarios() -> dict[str, Scenario]:
    """~6 representative cases: 1-4 requests, concurrent prefills, shared prefixes, MTP k=2,
    a prefix_match_unit finer than the mamba block, mamba blocks from 64 to 1600."""
    e, r = EngineConfig, RequestSpec
    return {
        "single-mb64": Scenario(
            e(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=128),
            prefixes=[], requests=[r(0, [], 300, 8)], token_seed=1,
        ),
        "shared-prefix-mb256": Scenario(
            e(mamba_block_size=256, attn_block_size=256, max_num_batched_tokens=512),
            prefixes=[600], requests=[r(0, [0], 100, 6), r(6, [0], 150, 6)], token_seed=2,
        ),
        "concurrent-4req-mb512": Scenario(
            e(mamba_block_size=512, attn_block_size=512, max_num_batched_tokens=1024),
            prefixes=[1100],
            requests=[r(0, [0], 300, 4), r(0, [0], 700, 4), r(1, [], 900, 4), r(12, [0], 50, 4)],
            token_seed=3,
        ),
        "mtp-k2-mb128": Scenario(
            e(mamba_block_size=128, attn_block_size=128, max_num_batched_tokens=256,
              spec_method="mtp", num_speculative_tokens=2),
            prefixes=[300], requests=[r(0, [0], 90, 12), r(6, [0], 40, 12)], acceptance=[2, 1, 0], token_seed=4,
        ),
        "pmu16-mb256": Scenario(
            e(mamba_block_size=256, attn_block_size=16, prefix_match_unit=16, max_num_batched_tokens=512),
            prefixes=[330], requests=[r(0, [0], 70, 4), r(5, [0], 200, 4), r(5, [], 100, 4)], token_seed=5,
        ),
        "long-mb1600": Scenario(
            e(mamba_block_size=1600, attn_block_size=1600, max_num_batched_tokens=2048),
            prefixes=[3300], requests=[r(0, [0], 500, 6), r(4, [0], 900, 6)], token_seed=6,
        ),
    }


def with_pool(s: Scenario, num_blocks: int) -> Scenario:
    """A copy of `s` whose engine has a fixed pool (the harness honours num_gpu_blocks)."""
    return dataclasses.replace(s, engine=dataclasses.replace(s.engine, num_gpu_blocks=num_blocks))


# ---- the bare baseline ----------------------------------------------------------------


def bare_run(s: Scenario, prefix_caching: bool = True) -> int:
    """Drive the same Scheduler the harness builds with no kernel model, truth or oracle;
    returns the number of engine steps taken (to check it matches the harness)."""
    engine = s.engine if prefix_caching else harness._without_prefix_caching(s.engine)
    num_blocks = engine.num_gpu_blocks or ample_pool_blocks(s)
    session = vb.SchedulerSession(engine, num_blocks, s.max_model_len(), None)
    spec = engine.uses_spec_decode
    k = engine.num_speculative_tokens
    ids = s.request_ids()
    bound = s.liveness_bound()
    accept_next: dict[str, int] = {}  # drafts proposed last step: how many will be accepted
    step = 0
    while True:
        if not any(r.arrival_step >= step for r in s.requests) and not session.has_unfinished():
            break
        if step >= bound:
            break
        for i, (rid, r) in enumerate(zip(ids, s.requests, strict=True)):
            if r.arrival_step == step:
                session.add_request(rid, s.prompt_tokens(i), r.max_tokens, float(step))
            elif r.abort_step == step and (req := session.request(rid)) is not None and not req.is_finished():
                session.abort([rid])
        out = session.schedule()
        spec_tokens = out.scheduled_spec_decode_tokens
        sampled: dict[str, list[int]] = {}
        for rid in out.num_scheduled_tokens:
            req = session.request(rid)
            if req.num_computed_tokens < req.num_tokens:
                continue  # a partial prefill samples nothing
            drafts = spec_tokens.get(rid)
            n = min(accept_next.get(rid, k), len(drafts)) + 1 if drafts else 1
            sampled[rid] = [CONST_TOKEN] * n
        session.feed(out, sampled, set())
        if spec:
            accept_next.clear()
            acc = s.acceptance[step % len(s.acceptance)] if s.acceptance else k
            drafts_out: dict[str, list[int]] = {}
            for rid in out.num_scheduled_tokens:
                req = session.request(rid)
                if (req is not None and not req.is_finished() and req.num_output_tokens > 0
                        and req.num_computed_tokens >= req.num_tokens - 1):
                    drafts_out[rid] = [CONST_TOKEN] * k
                    accept_next[rid] = acc
            session.set_drafts(drafts_out)
        step += 1
    return step


def bare_two_runs(s: Scenario) -> None:
    bare_run(s, True)
    bare_run(s, False)


# ---- timing ---------------------------------------------------------------------------

MODES: dict[str, Callable[[Scenario], object]] = {
    "bare1": bare_run,
    "bare2": bare_two_runs,
    "harness1": harness.run,
    "evaluate": lambda s: pipeline.evaluate(s, "fixed"),
    "fresh10k1": lambda s: harness.run(with_pool(s, FRESH_BLOCKS)),
    "fresh10k": lambda s: pipeline.evaluate(with_pool(s, FRESH_BLOCKS), "fixed"),
}


def measure(cases: dict[str, Scenario], reps: int, number: int) -> dict[str, dict[str, float]]:
    """Median seconds per single execution, per scenario and mode.  Modes are interleaved
    within each rep so drift hits them alike."""
    samples: dict[str, dict[str, list[float]]] = {n: {m: [] for m in MODES} for n in cases}
    for _ in range(reps):
        gc.collect()
        for name, s in cases.items():
            for mode, fn in MODES.items():
                t0 = time.perf_counter()
                for _ in range(number):
                    fn(s)
                samples[name][mode].append((time.perf_counter() - t0) / number)
    return {n: {m: statistics.median(v) for m, v in per.items()} for n, per in samples.items()}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions per measurement; the median is reported")
    ap.add_argument("--number", type=int, default=3, help="back-to-back executions inside one timed rep")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    args = ap.parse_args(argv)

    cases = scenarios()
    for name, s in cases.items():
        problems = validate(s)
        if problems:
            print(f"scenario {name} is invalid: {problems}", file=sys.stderr)
            return 2

    # Warm-up: builds (and caches) every VllmConfig, imports lazily loaded modules; excluded.
    t0 = time.perf_counter()
    info: dict[str, dict[str, object]] = {}
    for name, s in cases.items():
        ev = pipeline.evaluate(s, "fixed")
        for fn in MODES.values():
            fn(s)
        bare_steps = bare_run(s)
        info[name] = {
            "requests": len(s.requests),
            "pool_blocks": s.engine.num_gpu_blocks or ample_pool_blocks(s),
            "harness_steps": len(ev.trace.steps),
            "bare_steps": bare_steps,
            "clean": not ev.verdict.findings and ev.trace.crash is None,
        }
    warmup_s = time.perf_counter() - t0

    med = measure(cases, args.reps, args.number)

    def total(mode: str) -> float:
        return sum(m[mode] for m in med.values())

    n_cases = len(cases)
    execs_per_s = n_cases / total("evaluate")
    r_one = total("harness1") / total("bare1")
    r_eval = total("evaluate") / total("bare2")
    r_fresh = total("fresh10k") / total("evaluate")
    r_fresh_one = total("fresh10k1") / total("harness1")

    result = {
        "reps": args.reps,
        "number": args.number,
        "warmup_s": warmup_s,
        "scenarios": {n: {**info[n], **{f"{m}_ms": 1e3 * t for m, t in med[n].items()}} for n in cases},
        "totals_ms": {m: 1e3 * total(m) for m in MODES},
        "evaluate_execs_per_s": execs_per_s,
        "harness_one_run_over_bare": r_one,
        "evaluate_over_bare_two_runs": r_eval,
        "fresh10k_over_harness_evaluate": r_fresh,
        "fresh10k_over_harness_one_run": r_fresh_one,
        "targets": {
            "harness_one_run_over_bare_max": TARGET_BARE_RATIO,
            "evaluate_over_bare_two_runs_max": TARGET_BARE_RATIO,
            "fresh10k_speedup_min": TARGET_FRESH_SPEEDUP,
        },
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0

    print(f"warm-up (excluded): {warmup_s:.2f}s; median of {args.reps} reps x {args.number} executions; times in ms\n")
    head = (f"{'scenario':<22} {'req':>3} {'pool':>5} {'steps h/b':>9} {'bare1':>7} {'harn1':>7} {'h1/b1':>6} "
            f"{'bare2':>7} {'eval':>7} {'ev/b2':>6} {'fr10k':>8} {'fr/ev':>6} {'eval/s':>7}")
    print(head)
    print("-" * len(head))
    for name, m in med.items():
        i = info[name]
        steps = f"{i['harness_steps']}/{i['bare_steps']}"
        print(f"{name:<22} {i['requests']:>3} {i['pool_blocks']:>5} {steps:>9} "
              f"{1e3 * m['bare1']:>7.2f} {1e3 * m['harness1']:>7.2f} {m['harness1'] / m['bare1']:>5.2f}x "
              f"{1e3 * m['bare2']:>7.2f} {1e3 * m['evaluate']:>7.2f} {m['evaluate'] / m['bare2']:>5.2f}x "
              f"{1e3 * m['fresh10k']:>8.2f} {m['fresh10k'] / m['evaluate']:>5.1f}x {1 / m['evaluate']:>7.0f}")
    print("-" * len(head))
    print(f"{'total':<22} {'':>3} {'':>5} {'':>9} {1e3 * total('bare1'):>7.2f} {1e3 * total('harness1'):>7.2f} "
          f"{r_one:>5.2f}x {1e3 * total('bare2'):>7.2f} {1e3 * total('evaluate'):>7.2f} {r_eval:>5.2f}x "
          f"{1e3 * total('fresh10k'):>8.2f} {r_fresh:>5.1f}x {execs_per_s:>7.0f}")
    unclean = [n for n, i in info.items() if not i["clean"]]
    mismatched = [n for n, i in info.items() if i["harness_steps"] != i["bare_steps"]]
    if unclean:
        print(f"note: evaluate reported findings on {', '.join(unclean)} (timings still valid)")
    if mismatched:
        print(f"note: harness and bare step counts differ on {', '.join(mismatched)}")

    print("\nheadline")
    print(f"  a. evaluate() executions/s:                 {execs_per_s:8.1f}   (whole harness: cached + uncached + oracle)")
    print(f"  b. harness(one run)/bare:                   {r_one:8.2f}x  target <= {TARGET_BARE_RATIO}x  "
          f"{verdict(r_one <= TARGET_BARE_RATIO)}")
    print(f"     evaluate(2 runs + oracle)/bare(2 runs):  {r_eval:8.2f}x  target <= {TARGET_BARE_RATIO}x  "
          f"{verdict(r_eval <= TARGET_BARE_RATIO)}")
    print(f"  c. fresh10k/harness (evaluate):             {r_fresh:8.1f}x  target >= {TARGET_FRESH_SPEEDUP:.0f}x  "
          f"{verdict(r_fresh >= TARGET_FRESH_SPEEDUP)}")
    print(f"     fresh10k/harness (one run):              {r_fresh_one:8.1f}x  target >= {TARGET_FRESH_SPEEDUP:.0f}x  "
          f"{verdict(r_fresh_one >= TARGET_FRESH_SPEEDUP)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
