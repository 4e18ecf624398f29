"""Benchmark: what the runtime audit plugin (mambafuzz/engine_tier/audit_plugin.py) costs.

Run:  python bench/audit_overhead.py [--rounds N] [--requests N] [--json]

One process, one warm engine, the same workload replayed --rounds times without and with
the audit (install() / uninstall() between replays, alternating, so both modes see the same
warm kernels and the same machine load).  Throughput is tokens per second of this process's
CPU time (time.process_time; the engine core runs in-process with one torch thread); the
median of each mode counts, and the wall-clock ratio is printed beside it.

  engine     a real in-process vLLM engine (CPU backend, the tiny qwen3_next model, align mode,
             mamba block 256, budget 1024, prefix caching on) serving --requests requests that
             share two prefixes (1,000-2,500-token prompts, 32 output tokens each, all submitted
             at once).  Figure: prompt+generated tokens per CPU second of the stepping loop.
  scheduler  the same workload through the harness (vLLM's real Scheduler with the simulated
             runner, no model): an upper bound of the relative cost on a fast accelerator,
             where the forward pass no longer hides the scheduler-side work.

A benchmark, not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

BLOCK = 256


def workload(num_requests: int):
    from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario

    reqs = [RequestSpec(prefix_ids=[i % 2], unique_len=500 + 137 * i % 1000, max_tokens=32)
            for i in range(num_requests)]
    return Scenario(engine=EngineConfig(mamba_block_size=BLOCK, attn_block_size=BLOCK, max_num_batched_tokens=1024,
                                        max_num_seqs=max(8, num_requests)),
                    prefixes=[1000, 1500], requests=reqs, token_seed=7)


def _timed(fn: Callable[[], None]) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def measure(kind: str, rounds: int, num_requests: int) -> dict:
    from mambafuzz.engine_tier import audit_plugin

    s = workload(num_requests)
    tokens = sum(s.prompt_len(i) + r.max_tokens for i, r in enumerate(s.requests))
    if kind == "scheduler":
        from mambafuzz.sim.engine import harness

        def run() -> None:
            for _ in range(5):
                harness.run(s)

        tokens *= 5
        audit_of = lambda: audit_plugin.RECENT[-1] if audit_plugin.RECENT else None  # noqa: E731
    else:
        from mambafuzz.engine_tier import engines
        from mambafuzz.engine_tier.engine_repro import replay

        handle = engines.get_engine(engines.EngineSpec.for_scenario(s, True))

        def run() -> None:
            replay(handle, s)

        audit_of = lambda: audit_plugin.audit_of(handle.scheduler)  # noqa: E731
    run()  # warm-up: config building, first-shape kernel set-up
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    checked = poisoned = 0
    for _ in range(rounds):
        for audit in (False, True):
            if audit:
                audit_plugin.install()
            times[audit].append(_timed(run))
            if audit:
                a = audit_of()
                checked, poisoned = (a.checked, a.count) if a else (0, 0)
                audit_plugin.uninstall()
    cpu = {m: statistics.median(c for _, c in times[m]) for m in times}
    wall = {m: statistics.median(w for w, _ in times[m]) for m in times}
    return {"tokens_per_cpu_s_off": round(tokens / cpu[False], 1), "tokens_per_cpu_s_on": round(tokens / cpu[True], 1),
            "ratio_on_off": round(cpu[False] / cpu[True], 4), "wall_ratio_on_off": round(wall[False] / wall[True], 4),
            "checked": checked, "poisoned": poisoned, "rounds": rounds}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--kinds", default="engine,scheduler")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    report = {kind: measure(kind, args.rounds, args.requests) for kind in args.kinds.split(",")}
    if args.json:
        print(json.dumps(report))
    else:
        for kind, r in report.items():
            print(f"{kind:9s}  off {r['tokens_per_cpu_s_off']:>10.1f} tok/cpu-s  on {r['tokens_per_cpu_s_on']:>10.1f} "
                  f"tok/cpu-s  throughput on/off {r['ratio_on_off']:.3f} (wall-clock {r['wall_ratio_on_off']:.3f})  "
                  f"entries checked per run {r['checked']}, poisoned {r['poisoned']}, median of {r['rounds']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
