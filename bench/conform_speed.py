"""Benchmark: executions per second of the conformance driver (mambafuzz/conform/drive.py).

Run:  python bench/conform_speed.py [--reps N] [--runners v1,v2] FILE.json ...

Per scenario file: one warm-up run (config builds, first Triton interpretation), then the median
of --reps timed runs of `list(drive(scenario))`, beside bench/harness_speed.py's `bare_run` (the
same scheduler loop without vLLM's worker code) for scale. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.harness_speed import bare_run
from mambafuzz.search.startup import prepare_process

prepare_process(conform=True)  # this process's start-up step: Triton's CPU shim, before the conformance tier is imported

from mambafuzz.conform.drive import drive  # noqa: E402
from mambafuzz.model import runners as model_runners  # noqa: E402
from mambafuzz.store.corpus import load_case  # noqa: E402


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--runners", default=",".join(model_runners.names()),
                    help=f"comma-separated: {', '.join(model_runners.names())} (default: all)")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    runners = tuple(args.runners.split(","))
    print(f"{'scenario':48} {'steps':>5} {'drive/s':>8} {'bare/s':>8} {'ratio':>6}")
    for path in args.files:
        s = load_case(path).scenario
        prompts = s.static_prompts()
        steps = len(list(drive(s, runners)))  # warm-up
        bare_run(s, prompts)
        t_drive = _median_time(lambda s=s: list(drive(s, runners)), args.reps)
        t_bare = _median_time(lambda s=s, p=prompts: bare_run(s, p), args.reps)
        name = path.rsplit("/", 1)[-1]
        print(f"{name:48} {steps:5d} {1 / t_drive:8.1f} {1 / t_bare:8.1f} {t_drive / t_bare:6.1f}")


if __name__ == "__main__":
    main()
