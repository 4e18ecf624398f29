"""The feedback-free engine: the shared generator driven by a seeded PRNG.  Also replays
the corpus first, so seeds and earlier inputs are always re-checked.

Run as `python -m fuzz.random_worker --seed N --max-time S --runs N [CORPUS_DIR...]` with the
MAMBAFUZZ_* environment of `target_runtime`; `mambafuzz fuzz --engine random` does this.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path

from fuzz.generate import random_scenario
from fuzz.inputs import decode_input, iter_input_files
from fuzz.scenario import validate
from fuzz.target_runtime import Runtime, current_rss_mb


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fuzz.random_worker")
    p.add_argument("corpus", nargs="*")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-time", type=float, default=0.0)
    p.add_argument("--runs", type=int, default=0)
    p.add_argument("--rss-limit-mb", type=int, default=0)
    args = p.parse_args(argv)
    runtime = Runtime.from_env()
    gc.freeze()  # vLLM and torch's heap never needs rescanning by full collections
    deadline = time.monotonic() + args.max_time if args.max_time > 0 else None
    stats: dict = {}
    for path, data in iter_input_files([Path(c) for c in args.corpus], stats):
        scenario = decode_input(data)
        if scenario is not None:
            runtime.run_scenario(scenario, {"input": str(path)})
    rng = random.Random(args.seed)
    try:
        while (not args.runs or runtime.execs < args.runs) and (deadline is None or time.monotonic() < deadline):
            case_seed = rng.getrandbits(63)
            scenario = random_scenario(random.Random(case_seed))
            if validate(scenario):
                runtime.rejected += 1
                continue
            runtime.run_scenario(scenario, {"input": "random", "seed": args.seed, "case_seed": case_seed})
            if args.rss_limit_mb and current_rss_mb() > args.rss_limit_mb:
                print(f"@@rss-limit rss={current_rss_mb():.0f}MB limit={args.rss_limit_mb}MB", flush=True)
                runtime.status(final=True)
                return 3
    except KeyboardInterrupt:
        pass
    runtime.status(final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
