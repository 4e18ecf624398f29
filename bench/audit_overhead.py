"""Benchmark: what the runtime audit plugin (fuzz/engine_tier/audit_plugin.py) costs.

Run:  python bench/audit_overhead.py [--reps N] [--requests N] [--json]

Two figures, each the median of --reps alternating runs without and with MAMBAFUZZ_AUDIT=1,
every run in a fresh subprocess (the plugin patches vLLM classes process-wide).  Throughput is
tokens per second of this process's CPU time (time.process_time; the engine core runs
in-process with one torch thread), so other load on the machine does not skew the ratio;
the wall-clock ratio is printed beside it:

  engine     a real in-process vLLM engine (CPU backend, the tiny qwen3_next model, align mode,
             mamba block 256, budget 1024, prefix caching on) serving the same workload:
             --requests requests sharing two prefixes (1,000-2,500-token prompts, 32 output
             tokens each, all submitted at once).  Figure: prompt+generated tokens per CPU
             second of the stepping loop (start-up and a warm-up run excluded; fastest of 3).
  scheduler  the same workload through the harness (vLLM's real Scheduler with the simulated
             runner, no model): an upper bound of the relative cost on a fast accelerator,
             where the forward pass no longer hides the scheduler-side work.

A benchmark, not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BLOCK = 256
INNER_REPS = 3  # workload repetitions per process after a warm-up; the fastest counts


def workload(num_requests: int):
    from fuzz.scenario import EngineConfig, RequestSpec, Scenario

    reqs = [RequestSpec(prefix_ids=[i % 2], unique_len=500 + 137 * i % 1000, max_tokens=32)
            for i in range(num_requests)]
    return Scenario(engine=EngineConfig(mamba_block_size=BLOCK, attn_block_size=BLOCK, max_num_batched_tokens=1024,
                                        max_num_seqs=max(8, num_requests)),
                    prefixes=[1000, 1500], requests=reqs, token_seed=7)


def _child(kind: str, num_requests: int) -> dict:
    """One measurement in this process: kind is engine or scheduler."""
    from fuzz.engine_tier import audit_plugin

    audit_plugin.register()
    s = workload(num_requests)
    tokens = sum(s.prompt_len(i) + r.max_tokens for i, r in enumerate(s.requests))
    walls, cpus = [], []
    if kind == "scheduler":
        from fuzz import harness

        harness.run(s)  # warm-up: config building
        for _ in range(INNER_REPS * 5):
            w0, c0 = time.perf_counter(), time.process_time()
            harness.run(s)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        audit = audit_plugin.RECENT[-1] if audit_plugin.RECENT else None
    else:
        from fuzz.engine_tier import engines
        from fuzz.engine_tier.engine_repro import replay

        handle = engines.get_engine(engines.EngineSpec.for_scenario(s, True))
        replay(handle, s)  # warm-up: first-shape kernel set-up
        for _ in range(INNER_REPS):
            w0, c0 = time.perf_counter(), time.process_time()
            replay(handle, s)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        audit = audit_plugin.audit_of(handle.scheduler)
    return {"kind": kind, "audit": audit_plugin.enabled(), "tokens": tokens, "wall_s": min(walls),
            "cpu_s": min(cpus), "tokens_per_cpu_s": tokens / min(cpus), "tokens_per_s": tokens / min(walls),
            "checked": audit.checked if audit else 0, "poisoned": audit.count if audit else 0}


def _run(kind: str, audit: bool, num_requests: int) -> dict:
    env = dict(os.environ, MAMBAFUZZ_AUDIT="1" if audit else "0")
    proc = subprocess.run([sys.executable, __file__, "--child", kind, "--requests", str(num_requests)],
                          env=env, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise SystemExit(f"audit_overhead: child {kind} audit={audit} failed: {proc.stderr.strip()[-400:]}")
    return json.loads(lines[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--kinds", default="engine,scheduler")
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.requests)))
        return 0
    report = {}
    for kind in args.kinds.split(","):
        runs: dict[bool, list[dict]] = {False: [], True: []}
        for _ in range(args.reps):
            for audit in (False, True):
                runs[audit].append(_run(kind, audit, args.requests))
        off = statistics.median(r["tokens_per_cpu_s"] for r in runs[False])
        on = statistics.median(r["tokens_per_cpu_s"] for r in runs[True])
        off_wall = statistics.median(r["tokens_per_s"] for r in runs[False])
        on_wall = statistics.median(r["tokens_per_s"] for r in runs[True])
        report[kind] = {"tokens_per_cpu_s_off": round(off, 1), "tokens_per_cpu_s_on": round(on, 1),
                        "ratio_on_off": round(on / off, 4), "wall_ratio_on_off": round(on_wall / off_wall, 4),
                        "checked": runs[True][-1]["checked"], "poisoned": runs[True][-1]["poisoned"],
                        "reps": args.reps}
    if args.json:
        print(json.dumps(report))
    else:
        for kind, r in report.items():
            print(f"{kind:9s}  off {r['tokens_per_cpu_s_off']:>10.1f} tok/cpu-s  on {r['tokens_per_cpu_s_on']:>10.1f} "
                  f"tok/cpu-s  throughput on/off {r['ratio_on_off']:.3f} (wall-clock {r['wall_ratio_on_off']:.3f})  "
                  f"entries checked {r['checked']}, poisoned {r['poisoned']}, median of {r['reps']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
