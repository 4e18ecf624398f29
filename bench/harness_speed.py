"""Benchmark: how fast is the fuzz harness, against bare vLLM scheduling and a 10k-block pool?

Run:  python bench/harness_speed.py [--reps N] [--number M] [--window W] [--gc on|off|freeze]
                                    [--clock wall|cpu] [--runner v1|v2] [--scheduling sync|async]
                                    [--json]

On a fixed set of representative scenarios it measures these modes (the warm-up that builds
the VllmConfigs is excluded; time.perf_counter, or time.process_time with --clock cpu):

  bare1     one cached run of a minimal loop: the same SchedulerSession the harness builds
            (same pool: engine.num_gpu_blocks or ample_pool_blocks), the same arrivals, and
            outputs fed as a constant sampled token (spec-decode scenarios propose constant
            drafts and accept them with the scenario's acceptance pattern, so both loops take
            the same steps);
            Prompt token ids are built once, outside the timing (that is harness work);
  bare2     bare1 plus the same loop with prefix caching off (what evaluate's 2 runs cost bare);
  harness1  mambafuzz.sim.engine.harness.run(scenario): one cached harness run;
  evaluate  mambafuzz.checks.pipeline.evaluate(scenario, "fixed"): cached + uncached runs + oracle;
  tests10k  evaluate as vLLM's own CPU tests build a scheduler (tests/v1/core/utils.py,
            create_scheduler): every run builds its ModelConfig, VllmConfig, KVCacheConfig and a
            Scheduler over a fresh 10,000-block KVCacheManager from scratch (our build caches
            are bypassed); also tests10k1 for a single harness run;
  fresh10k  the stricter variant: configs cached as the harness caches them, only the pool is
            a fresh 10,000 blocks per run (engine.num_gpu_blocks = 10000); also fresh10k1.

Two ways of timing, because the 10k-block modes are dominated by garbage collection:
  * bare/harness/evaluate: median over --reps; each rep runs every scenario --number times
    back to back, after a gc.collect().  These modes trigger no full collection.
  * steady state (harness1, evaluate and the four 10k modes): each mode runs --window rounds
    of the whole suite back to back with one gc.collect() before, and the mean is reported
    with the full (generation-2) collections that fell inside.  A fresh 10,000-block pool
    leaves ~10k objects to promote per run, so a full collection of this process's heap
    (vLLM and torch loaded: ~0.4 s) comes every ~20 runs; a window that starts right after a
    collection sees at most one period fewer than its length implies, so the 10k modes'
    cost is if anything underestimated.  Timing a few runs after a forced collection instead
    would land the pauses by chance.

It prints a table and three headline figures with targets (PASS/MISS; nothing is asserted):
  a. evaluate executions per second;
  b. harness(one run)/bare and evaluate(2 runs + oracle)/bare(2 runs), target <= 1.3x;
  c. steady tests10k / evaluate, target >= 20x; one-run and pool-only variants alongside.
A benchmark, not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator

from mambafuzz.checks import pipeline
from mambafuzz.model import runners as model_runners
from mambafuzz.model.scenario import (
    EngineConfig,
    RequestSpec,
    Scenario,
    ample_pool_blocks,
    validate,
    with_runner,
    with_scheduling,
)
from mambafuzz.model.step_plan import StepPlan
from mambafuzz.sim.bridge import configs, scheduler_session
from mambafuzz.sim.engine import harness
from mambafuzz.sim.engine.engine_core import BatchQueue
from mambafuzz.sim.worker.constant_worker import ConstantWorker

FRESH_BLOCKS = 10_000
TARGET_BARE_RATIO = 1.3
TARGET_FRESH_SPEEDUP = 20.0


# ---- scenarios ------------------------------------------------------------------------


RESOURCE_KINDS = ("missed_hit", "capacity", "pool_accounting")


def scenarios() -> dict[str, Scenario]:
    """~7 representative cases: 1-4 requests, concurrent prefills, shared prefixes, MTP k=2,
    a prefix_match_unit finer than the mamba block, mamba blocks from 64 to 1600, a chain of turns."""
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
        "multi-turn-mb64": Scenario(  # a chain of turns, each continuing the last one's output
            e(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=256),
            prefixes=[], requests=[r(0, [], 150, 40), r(0, [], 30, 20, continues=0), r(0, [], 20, 8, continues=1)],
            token_seed=7,
        ),
    }


def with_pool(s: Scenario, num_blocks: int) -> Scenario:
    """A copy of `s` whose engine has a fixed pool (the harness honours num_gpu_blocks)."""
    return dataclasses.replace(s, engine=dataclasses.replace(s.engine, num_gpu_blocks=num_blocks))


# ---- the bare baseline ----------------------------------------------------------------


def bare_run(s: Scenario, prompts: list[list[int] | None], prefix_caching: bool = True) -> int:
    """Drive the same Scheduler the harness builds with no kernel model, truth or oracle, under
    the same engine-core loop (mambafuzz.sim.engine.engine_core.BatchQueue: vLLM's AsyncScheduler with its
    batch queue when the scenario runs async) and a constant-token worker
    (mambafuzz.sim.worker.constant_worker); returns the number of engine steps taken (to check it matches
    the harness).  `prompts` are the scenario's prompt token ids, built once outside the
    timing: turning a scenario into token ids is harness work, not vLLM's."""
    engine = s.engine if prefix_caching else s.engine.without_prefix_caching()
    num_blocks = engine.num_gpu_blocks or ample_pool_blocks(s)
    session = scheduler_session.SchedulerSession(engine, num_blocks, s.max_model_len(), None, s.uses_connector)
    queue = BatchQueue(session.batch_queue_depth)
    worker = ConstantWorker(session, s, queue)
    plan = StepPlan.of(s)
    step = 0
    while plan.end(step, session.has_unfinished() or bool(queue)) is None:
        plan.feed(step, session, prompts)
        queue.step(session, lambda batch, step=step: worker.forward(batch, step),
                   lambda batch, step=step: worker.apply(batch, step))
        step += 1
    return step


def bare_two_runs(s: Scenario, prompts: list[list[int] | None]) -> None:
    bare_run(s, prompts, True)
    bare_run(s, prompts, False)


# ---- timing ---------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    scenario: Scenario
    prompts: list[list[int] | None]  # for the bare loop only
    fresh: Scenario  # the scenario with a 10,000-block pool


@contextlib.contextmanager
def builds_from_scratch() -> Iterator[None]:
    """While active, every harness run builds its configs as a vLLM unit test does: the
    bridge's ModelConfig, VllmConfig and KV-cache-group caches are bypassed (and left intact
    for the other modes)."""
    saved = (configs._VLLM_CONFIGS, configs.tiny_model_config, configs.kv_cache_groups_for, configs.vllm_config_for)
    cached_builder = configs.vllm_config_for

    def from_scratch(e, max_model_len, connector=True):
        configs._VLLM_CONFIGS = {}
        return cached_builder(e, max_model_len, connector)

    configs.tiny_model_config = saved[1].__wrapped__
    configs.kv_cache_groups_for = saved[2].__wrapped__
    configs.vllm_config_for = from_scratch
    try:
        yield
    finally:
        configs._VLLM_CONFIGS, configs.tiny_model_config, configs.kv_cache_groups_for, configs.vllm_config_for = saved


def as_vllm_tests(fn: Callable[[], object]) -> None:
    with builds_from_scratch():
        fn()


MODES: dict[str, Callable[[Case], object]] = {
    "bare1": lambda c: bare_run(c.scenario, c.prompts),
    "bare2": lambda c: bare_two_runs(c.scenario, c.prompts),
    "harness1": lambda c: harness.run(c.scenario),
    "evaluate": lambda c: pipeline.evaluate(c.scenario, "fixed"),
}
STEADY_MODES: dict[str, Callable[[Case], object]] = {
    "harness1": MODES["harness1"],
    "evaluate": MODES["evaluate"],
    "fresh10k1": lambda c: harness.run(c.fresh),
    "fresh10k": lambda c: pipeline.evaluate(c.fresh, "fixed"),
    "tests10k1": lambda c: as_vllm_tests(lambda: harness.run(c.fresh)),
    "tests10k": lambda c: as_vllm_tests(lambda: pipeline.evaluate(c.fresh, "fixed")),
}


def measure(cases: dict[str, Case], reps: int, number: int, gc_mode: str,
            clock: Callable[[], float] = time.perf_counter) -> tuple[dict, dict]:
    """Seconds per single execution: (median per scenario and mode, median suite total per mode).

    One rep of a mode runs every scenario `number` times back to back, after a gc.collect()."""
    per: dict[str, dict[str, list[float]]] = {n: {m: [] for m in MODES} for n in cases}
    suite: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(reps):
        for mode, fn in MODES.items():
            gc.collect()
            if gc_mode == "off":
                gc.disable()
            rep_total = 0.0
            for name, case in cases.items():
                t0 = clock()
                for _ in range(number):
                    fn(case)
                dt = (clock() - t0) / number
                per[name][mode].append(dt)
                rep_total += dt
            gc.enable()
            suite[mode].append(rep_total)
    med = {n: {m: statistics.median(v) for m, v in d.items()} for n, d in per.items()}
    return med, {m: statistics.median(v) for m, v in suite.items()}


@dataclasses.dataclass
class Steady:
    suite_s: float  # mean seconds per round of the whole suite
    per_scenario_s: dict[str, float]  # mean seconds per execution
    full_collections: int  # generation-2 collections inside the window
    full_collection_s: float  # their total wall time, per round


def measure_steady(cases: dict[str, Case], window: int, gc_mode: str,
                   clock: Callable[[], float] = time.perf_counter) -> dict[str, Steady]:
    """Each steady mode runs `window` rounds of the suite back to back (see the module docstring)."""
    full = {"count": 0, "seconds": 0.0, "start": 0.0}

    def on_gc(phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            full["start"] = time.perf_counter()
        else:
            full["count"] += 1
            full["seconds"] += time.perf_counter() - full["start"]

    out: dict[str, Steady] = {}
    gc.callbacks.append(on_gc)
    try:
        for mode, fn in STEADY_MODES.items():
            gc.collect()
            full.update(count=0, seconds=0.0)
            if gc_mode == "off":
                gc.disable()
            spent = dict.fromkeys(cases, 0.0)
            for _ in range(window):
                for name, case in cases.items():
                    t0 = clock()
                    fn(case)
                    spent[name] += clock() - t0
            gc.enable()
            out[mode] = Steady(sum(spent.values()) / window, {n: v / window for n, v in spent.items()},
                               full["count"], full["seconds"] / window)
    finally:
        gc.callbacks.remove(on_gc)
    return out


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions per measurement; the median is reported")
    ap.add_argument("--number", type=int, default=3, help="back-to-back executions of each scenario in one rep")
    ap.add_argument("--gc", choices=("on", "off", "freeze"), default="on",
                    help="cyclic GC while timing: on (as a fuzz run sees it), off (as timeit does), or "
                         "freeze (gc.freeze() after warm-up, so full collections skip vLLM/torch's heap)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: time.perf_counter (default); cpu: time.process_time, steadier on a loaded machine")
    ap.add_argument("--window", type=int, default=40,
                    help="rounds of the whole suite per steady-state mode (default 40: about 240 runs, a dozen "
                         "full-collection periods of the 10k modes)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    ap.add_argument("--runner", choices=model_runners.names(), default=None,
                    help="the model runner the harness models (default: what vLLM picks on a CUDA host per config)")
    ap.add_argument("--scheduling", choices=("sync", "async"), default=None,
                    help="the engine-core loop for every scenario, the bare loop's included (default: vLLM's pick on "
                         "a CUDA host, async)")
    args = ap.parse_args(argv)
    for flag in ("reps", "number", "window"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} must be at least 1")

    scen = {name: with_scheduling(with_runner(s, args.runner), args.scheduling) for name, s in scenarios().items()}
    for name, s in scen.items():
        problems = validate(s)
        if problems:
            print(f"scenario {name} is invalid: {problems}", file=sys.stderr)
            return 2
    cases = {n: Case(s, s.static_prompts(), with_pool(s, FRESH_BLOCKS))
             for n, s in scen.items()}

    # Warm-up: builds (and caches) every VllmConfig and imports what vLLM loads lazily; excluded.
    t0 = time.perf_counter()
    info: dict[str, dict[str, object]] = {}
    for name, case in cases.items():
        s = case.scenario
        ev = pipeline.evaluate(s, "fixed")
        for fn in (*MODES.values(), *STEADY_MODES.values()):
            fn(case)
        info[name] = {
            "requests": len(s.requests),
            "pool_blocks": s.engine.num_gpu_blocks or ample_pool_blocks(s),
            "harness_steps": len(ev.trace.steps),
            "bare_steps": bare_run(s, case.prompts),
            # the states, outputs and liveness: the resource oracles' findings are listed apart (under async
            # scheduling most cases hold the in-flight state block of corpus/upstream's sixth entry)
            "clean": not [f for f in ev.verdict.findings if f.kind not in RESOURCE_KINDS] and ev.trace.crash is None,
            "resource_findings": sorted({f.signature for f in ev.verdict.findings if f.kind in RESOURCE_KINDS}),
        }
    warmup_s = time.perf_counter() - t0
    if args.gc == "freeze":
        gc.collect()
        gc.freeze()

    clock = time.perf_counter if args.clock == "wall" else time.process_time
    med, totals = measure(cases, args.reps, args.number, args.gc, clock)
    steady = measure_steady(cases, args.window, args.gc, clock)

    execs_per_s = len(cases) / totals["evaluate"]
    r_one = totals["harness1"] / totals["bare1"]
    r_eval = totals["evaluate"] / totals["bare2"]
    st = {m: v.suite_s for m, v in steady.items()}
    r_tests = st["tests10k"] / st["evaluate"]
    r_tests_one = st["tests10k1"] / st["harness1"]
    r_fresh = st["fresh10k"] / st["evaluate"]
    r_fresh_one = st["fresh10k1"] / st["harness1"]

    if args.json:
        print(json.dumps({
            "reps": args.reps,
            "number": args.number,
            "window": args.window,
            "gc": args.gc,
            "clock": args.clock,
            "scheduling": args.scheduling or "default (async)",
            "warmup_s": warmup_s,
            "scenarios": {n: {**info[n], **{f"{m}_ms": 1e3 * v for m, v in med[n].items()},
                              **{f"steady_{m}_ms": 1e3 * v.per_scenario_s[n] for m, v in steady.items()}}
                          for n in cases},
            "suite_ms": {m: 1e3 * v for m, v in totals.items()},
            "steady_suite_ms": {m: 1e3 * v for m, v in st.items()},
            "steady_full_collections": {m: v.full_collections for m, v in steady.items()},
            "steady_full_collection_ms_per_suite": {m: 1e3 * v.full_collection_s for m, v in steady.items()},
            "evaluate_execs_per_s": execs_per_s,
            "harness_one_run_over_bare": r_one,
            "evaluate_over_bare_two_runs": r_eval,
            "tests10k_over_harness_evaluate": r_tests,
            "tests10k_over_harness_one_run": r_tests_one,
            "fresh10k_over_harness_evaluate": r_fresh,
            "fresh10k_over_harness_one_run": r_fresh_one,
            "targets": {"harness_over_bare_max": TARGET_BARE_RATIO, "tests10k_speedup_min": TARGET_FRESH_SPEEDUP},
        }, indent=1))
        return 0

    print(f"warm-up (excluded): {warmup_s:.2f}s; gc {args.gc}; clock {args.clock}; "
          f"scheduling {args.scheduling or 'default (async)'}; ms per execution")
    print(f"bare/harness/evaluate: median of {args.reps} reps x {args.number} executions per scenario; "
          f"steady state: mean over {args.window} rounds of the suite\n")
    head = (f"{'scenario':<22} {'req':>3} {'pool':>5} {'steps h/b':>9} {'bare1':>7} {'harn1':>7} {'h1/b1':>6} "
            f"{'bare2':>7} {'eval':>7} {'ev/b2':>6} {'eval/s':>7} | {'steady':>7} {'fr10k':>7} {'ts10k':>7}")
    print(head)
    print("-" * len(head))
    for name, m in med.items():
        i = info[name]
        steps = f"{i['harness_steps']}/{i['bare_steps']}"
        print(f"{name:<22} {i['requests']:>3} {i['pool_blocks']:>5} {steps:>9} "
              f"{1e3 * m['bare1']:>7.2f} {1e3 * m['harness1']:>7.2f} {m['harness1'] / m['bare1']:>5.2f}x "
              f"{1e3 * m['bare2']:>7.2f} {1e3 * m['evaluate']:>7.2f} {m['evaluate'] / m['bare2']:>5.2f}x "
              f"{1 / m['evaluate']:>7.0f} | {1e3 * steady['evaluate'].per_scenario_s[name]:>7.2f} "
              f"{1e3 * steady['fresh10k'].per_scenario_s[name]:>7.2f} {1e3 * steady['tests10k'].per_scenario_s[name]:>7.2f}")
    print("-" * len(head))
    t = totals
    print(f"{'suite':<22} {'':>3} {'':>5} {'':>9} {1e3 * t['bare1']:>7.2f} {1e3 * t['harness1']:>7.2f} "
          f"{r_one:>5.2f}x {1e3 * t['bare2']:>7.2f} {1e3 * t['evaluate']:>7.2f} {r_eval:>5.2f}x "
          f"{execs_per_s:>7.0f} | {1e3 * st['evaluate']:>7.2f} {1e3 * st['fresh10k']:>7.2f} {1e3 * st['tests10k']:>7.2f}")
    print("(steady columns are evaluate-mode means; a 10k mode's full collections land on whichever scenario "
          "is running, so read the suite row)")
    unclean = [n for n, i in info.items() if not i["clean"]]
    mismatched = [n for n, i in info.items() if i["harness_steps"] != i["bare_steps"]]
    if unclean:
        print(f"note: evaluate reported findings on {', '.join(unclean)} (timings still valid)")
    if mismatched:
        print(f"note: harness and bare step counts differ on {', '.join(mismatched)}")

    print("\nsteady state, per round of the suite:")
    for mode, v in steady.items():
        print(f"  {mode:<10} {1e3 * v.suite_s:9.2f} ms   full collections: {v.full_collections:3d} in the window, "
              f"{1e3 * v.full_collection_s:7.2f} ms per round")

    print("\nheadline")
    print(f"  a. evaluate() executions/s:                        {execs_per_s:8.1f}   (cached + uncached run + oracle)")
    print(f"  b. harness(one run)/bare:                          {r_one:8.2f}x  target <= {TARGET_BARE_RATIO}x  "
          f"{verdict(r_one <= TARGET_BARE_RATIO)}")
    print(f"     evaluate(2 runs + oracle)/bare(2 runs):         {r_eval:8.2f}x  target <= {TARGET_BARE_RATIO}x  "
          f"{verdict(r_eval <= TARGET_BARE_RATIO)}")
    print(f"  c. built as vLLM's tests build / harness (evaluate): {r_tests:6.1f}x  target >= "
          f"{TARGET_FRESH_SPEEDUP:.0f}x  {verdict(r_tests >= TARGET_FRESH_SPEEDUP)}")
    print(f"     built as vLLM's tests build / harness (one run):  {r_tests_one:6.1f}x")
    print(f"     fresh 10k pool only, configs cached (evaluate):   {r_fresh:6.1f}x  (stricter; no target)")
    print(f"     fresh 10k pool only, configs cached (one run):    {r_fresh_one:6.1f}x")
    return 0

if __name__ == "__main__":
    sys.exit(main())
