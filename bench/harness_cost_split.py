"""Benchmark: what each of the harness's per-step checks costs, as harness(one run)/bare with that
check switched off, beside the full harness, all measured in one process and interleaved.

Run:  python bench/harness_cost_split.py [--reps N] [--runner v1|v2] [--scheduling sync|async]

The scenarios and the bare loop are bench/harness_speed.py's (its headline b is the full harness's
ratio here). Each variant stubs one piece for its timing only and restores it: the resource facts
after each step (`PoolFacts.step`), the pool walk inside them (`PoolFacts.walk`), the lone holder
(`SchedulerSession.lone_holding`), the incremental cache audit (`CacheScan.step`), the attention
blocks' contents (`AttentionBlocks`), the scheduler-to-worker told-blocks rule
(`check_told_blocks`), and the free-time key check (`SchedulerSession.watch_frees`). A variant's
runs are not judged (a stub changes what they record): the figures say where the time goes, so a
speed target can be weighed against the checks it would cost. CPU time (time.process_time),
median over --reps rounds of 3 suites each. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness_speed  # noqa: E402  (the bench's scenarios and its bare loop)

from mambafuzz.model import runners as model_runners  # noqa: E402
from mambafuzz.model.scenario import with_runner, with_scheduling  # noqa: E402
from mambafuzz.sim.bridge import scheduler_session  # noqa: E402
from mambafuzz.sim.engine import attention_kv, cache_scan, harness, pool_facts  # noqa: E402


def _stubs() -> dict[str, list[tuple[object, str, object]]]:
    """variant -> (owner, attribute, stand-in) to set for its timing."""
    return {
        "full harness": [],
        "- resource facts": [(pool_facts.PoolFacts, "step", lambda self, step: None)],
        "- pool walk": [(pool_facts.PoolFacts, "walk", lambda self, step: self.session.num_free_blocks())],
        "- lone holder": [(scheduler_session.SchedulerSession, "lone_holding", lambda self: None)],
        "- cache audit scan": [(cache_scan.CacheScan, "step", lambda self, rec: None)],
        "- attention contents": [(attention_kv.AttentionBlocks, "written", lambda self, *a, **k: None),
                                 (attention_kv.AttentionBlocks, "judge_hit", lambda self, *a: None)],
        "- told-blocks rule": [(harness, "check_told_blocks", lambda *a: None)],
        "- free-time key check": [(scheduler_session.SchedulerSession, "watch_frees", lambda self, report: None)],
    }


def _timed(fn: Callable[[], None]) -> float:
    gc.collect()
    t = time.process_time()
    for _ in range(3):
        fn()
    return (time.process_time() - t) / 3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9, help="interleaved rounds; the median is reported (default 9)")
    ap.add_argument("--runner", choices=model_runners.names(), default="v2")
    ap.add_argument("--scheduling", choices=("sync", "async"), default="async")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    scen = {n: with_scheduling(with_runner(s, args.runner), args.scheduling)
            for n, s in harness_speed.scenarios().items()}
    prompts = {n: s.static_prompts() for n, s in scen.items()}

    def bare() -> None:
        for n, s in scen.items():
            harness_speed.bare_run(s, prompts[n])

    def runs() -> None:
        for s in scen.values():
            harness.run(s)

    stubs = _stubs()
    for _ in range(2):  # warm-up: configs built, lazy imports done
        bare()
        runs()
    times: dict[str, list[float]] = {name: [] for name in ("bare", *stubs)}
    for _ in range(args.reps):
        times["bare"].append(_timed(bare))
        for name, patches in stubs.items():
            saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patches]
            try:
                for owner, attr, stand_in in patches:
                    setattr(owner, attr, stand_in)
                times[name].append(_timed(runs))
            finally:
                for owner, attr, original in saved:
                    setattr(owner, attr, original)
    base = statistics.median(times["bare"])
    full = statistics.median(times["full harness"])
    print(f"{'variant':24s} {'ms/suite':>9s} {'/bare':>7s} {'saves':>7s}   ({args.runner}, {args.scheduling}, "
          f"{args.reps} rounds, CPU time)")
    for name, ts in times.items():
        m = statistics.median(ts)
        saves = "" if name in ("bare", "full harness") else f"{(full - m) / base:+.3f}x"
        print(f"{name:24s} {m * 1000:9.2f} {m / base:6.3f}x {saves:>7s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
