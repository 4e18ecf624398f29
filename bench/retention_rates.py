"""How often generated scenarios are flagged, per retention class and split.

vLLM keeps mamba states sparsely by default (`prefix_cache_retention_interval` 0: only replay
boundaries and shared-prefix junctions), so a poisoned boundary is often simply not cached.
This prints, for N random scenarios from the fuzzer's own generator, the share flagged under
each retention class (dense: None or an interval of one block; "0"; a coarser interval), so a
change to the generator or the harness shows what it does to the fuzzer's reach.

    python bench/retention_rates.py [--runs 1500] [--seed 1] [--splits prefix fixed]
"""

from __future__ import annotations

import argparse
import collections
import random
import time

from mambafuzz.checks.pipeline import evaluate
from mambafuzz.model.generate import random_scenario
from mambafuzz.model.scenario import EngineConfig, validate
from mambafuzz.sim.engine import splits


def retention_class(e: EngineConfig) -> str:
    r = e.prefix_cache_retention_interval
    if r is None or (r and r <= e.mamba_block_size):
        return "dense"
    return "0" if r == 0 else "interval"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--splits", nargs="+", default=["prefix", "fixed"])
    args = ap.parse_args()
    for split in args.splits:
        try:
            splits.resolve(split)
        except splits.SplitError as exc:
            ap.error(str(exc))
    for split in args.splits:
        rng = random.Random(args.seed)
        total: collections.Counter[str] = collections.Counter()
        flagged: collections.Counter[tuple[str, str]] = collections.Counter()
        t0 = time.process_time()
        for _ in range(args.runs):
            s = random_scenario(random.Random(rng.getrandbits(32)))
            if validate(s) or not s.engine.enable_prefix_caching:
                continue
            cls = retention_class(s.engine)
            total[cls] += 1
            primary = evaluate(s, split, differential=False).verdict.primary
            if primary is not None:
                flagged[(cls, primary.signature)] += 1
        print(f"split {split}: {sum(total.values())} scenarios, {time.process_time() - t0:.0f} s CPU")
        for cls in ("dense", "0", "interval"):
            hits = sum(n for (c, _), n in flagged.items() if c == cls)
            print(f"  retention {cls:8s} {total[cls]:5d} scenarios, {hits:4d} flagged ({100 * hits / max(1, total[cls]):.1f}%)")
            for (c, sig), n in sorted(flagged.items()):
                if c == cls:
                    print(f"      {n:4d}  {sig}")


if __name__ == "__main__":
    main()
