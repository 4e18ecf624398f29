"""How often the generator draws, in one scenario, what the async-load + spec-decode deadlock
class needs (issue #34; the planted `deadlock_async_load_spec_slots_*`, vllm-project/vllm#57104
undone): spec decoding, two or more requests whose connector hits load asynchronously (parked
together: one arrival step, or loads that take more than one forward), and a drawn pool.

    python bench/spec_async_cooccurrence.py [SEEDS=2000] [--verify MUTANT] [--first-seed N]

Counts the dimensions over `random_scenario(random.Random(seed))` for seeds N..N+SEEDS-1 (the
random generator's draw; invalid scenarios are skipped as the fuzzer skips them). `--verify`
also runs every scenario that has the deadlock's ingredients (spec decode and two async loads)
with the planted bug and without it, and counts those that stall with it and are clean without
(the ground truth: a scenario the fuzzer would file). Nothing here encodes the bug's trigger
into the generator; it only measures.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

from mambafuzz.model.generate import random_scenario
from mambafuzz.model.scenario import min_pool_blocks, validate


def features(s) -> dict[str, bool]:
    e = s.engine
    loads = [(i, r) for i, r in enumerate(s.requests) if r.external_tokens and r.external_async]
    arrivals = Counter(r.arrival_step for _, r in loads)
    parked_together = len(loads) >= 2 and (max(arrivals.values()) >= 2 or e.connector_recv_steps > 0)
    pool = e.num_gpu_blocks
    lo = min_pool_blocks(s)
    return {
        "spec": e.uses_spec_decode,
        "async_load>=1": len(loads) >= 1,
        "async_load>=2": len(loads) >= 2,
        "pool_drawn": pool is not None,
        "pool<=min+8": pool is not None and pool <= lo + 8,
        "spec&async>=1": e.uses_spec_decode and len(loads) >= 1,
        "spec&async>=2": e.uses_spec_decode and len(loads) >= 2,
        "spec&async>=2&pool": e.uses_spec_decode and len(loads) >= 2 and pool is not None,
        "spec&async>=2&parked_together": e.uses_spec_decode and parked_together,
        "spec&async>=2&parked_together&pool": e.uses_spec_decode and parked_together and pool is not None,
    }


def verdict(s, mutant: str | None) -> list[str]:
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.sim import patching
    from mambafuzz.tools.mutation import planting

    with patching.applied(planting.patches(mutant) if mutant else []):
        v = evaluate(s, "fixed", differential=False, efficiency=False).verdict
    return [f.signature for f in v.findings]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("seeds", type=int, nargs="?", default=2000)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--verify", metavar="MUTANT")
    args = ap.parse_args()
    counts: Counter[str] = Counter()
    valid = 0
    found: list[tuple[int, list[str]]] = []
    checked = 0
    t0 = time.monotonic()
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        s = random_scenario(random.Random(seed))
        if validate(s):
            continue
        valid += 1
        f = features(s)
        counts.update(k for k, v in f.items() if v)
        if args.verify and f["spec&async>=2"]:
            checked += 1
            with_bug = verdict(s, args.verify)
            if any(sig.startswith("stall") for sig in with_bug) and not verdict(s, None):
                found.append((seed, with_bug))
    print(f"{valid} valid scenarios of {args.seeds} seeds (from {args.first_seed})")
    for k in features(random_scenario(random.Random(0))):
        print(f"  {k:40s} {counts[k]:6d}  {100 * counts[k] / max(valid, 1):6.2f}%")
    if args.verify:
        print(f"--verify {args.verify}: {checked} scenarios with spec decode and >=2 async loads run; "
              f"{len(found)} stall with it and are clean without: {found}")
    print(f"{time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
