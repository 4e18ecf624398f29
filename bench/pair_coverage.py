"""How often the generator's executions draw two dimensions together (issue #34, "drawing
dimensions together"): a bug that needs two of them is found only as often as the pair occurs.

    python bench/pair_coverage.py [N=600] [--generator random|pairs] [--first-seed S] [--rarest K] [--json FILE]

Draws N scenarios as the random generator does (`random_scenario(random.Random(seed))`, seeds
S..S+N-1; invalid ones skipped, as the fuzzer skips them), or as the `pairs` generator does
(`--generator pairs`: mambafuzz.search.pair_search seeded with S, fed each run's features, so
its later inputs follow what the earlier ones reached), runs each once with prefix caching (the
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
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

from mambafuzz.model.scenario import ScenarioError, validate
from mambafuzz.search.state_coverage import EVENTS, KNOBS, dimensions
from mambafuzz.search.state_coverage import pairs as pairs_of


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("n", type=int, nargs="?", default=600, help="scenarios to draw (default 600)")
    ap.add_argument("--generator", choices=("random", "pairs"), default="random",
                    help="draw as the random generator (default) or the pairs generator")
    ap.add_argument("--first-seed", type=int, default=0, help="random: the first seed; pairs: the search's seed")
    ap.add_argument("--rarest", type=int, default=25, help="rarest pairs to list (default 25)")
    ap.add_argument("--json", type=Path, help="also write every dimension's and pair's count here")
    args = ap.parse_args(argv)
    if args.n < 1 or args.rarest < 0:
        print("pair_coverage: N must be at least 1 and --rarest at least 0", file=sys.stderr)
        return 2
    from mambafuzz.model.generate import random_scenario, scenario_from_bytes
    from mambafuzz.search.pair_search import PairSearch
    from mambafuzz.search.state_coverage import features
    from mambafuzz.sim.engine import harness  # imports vLLM: after the arguments are checked

    dims: Counter[str] = Counter()
    pairs: Counter[tuple[str, str]] = Counter()
    runs = skipped = 0
    search = PairSearch(random.Random(args.first_seed)) if args.generator == "pairs" else None
    t0 = time.monotonic()
    for seed in range(args.first_seed, args.first_seed + args.n):
        data = search.next_input() if search is not None else None
        s = scenario_from_bytes(data) if data is not None else random_scenario(random.Random(seed))
        try:
            if validate(s):  # a list of problems (it raises nothing): the fuzzer skips these
                raise ScenarioError(validate(s))
            trace = harness.run(s)
        except ScenarioError:
            skipped += 1
            continue
        have = dimensions(s, trace)
        if search is not None:
            search.observe(data, features(have))
        runs += 1
        dims.update(have)
        pairs.update(pairs_of(have))
        if runs % 100 == 0:
            print(f"[{time.monotonic() - t0:6.1f}s] {runs} executions", file=sys.stderr)
    if not runs:
        print("pair_coverage: every drawn scenario was invalid; nothing measured", file=sys.stderr)
        return 1
    names = sorted(dims)
    absent = sorted(({name for name, _ in KNOBS} | set(EVENTS)) - set(names))
    drawn = (f"seeds {args.first_seed}..{args.first_seed + args.n - 1}" if search is None else
             f"pairs search seeded {args.first_seed}: {search.fresh} fresh, {search.mutated} mutated, {len(search.pool)} kept")
    print(f"{runs} executions ({skipped} invalid draws skipped), {drawn}, {time.monotonic() - t0:.0f} s")
    print("\nshare of executions with each dimension:")
    for name in sorted(names, key=lambda n: -dims[n]):
        print(f"  {name:34s} {dims[name]:6d}  {100 * dims[name] / runs:5.1f}%")
    if absent:
        print(f"  never: {', '.join(absent)}")
    possible = pairs_of(names)
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
            "executions": runs, "generator": args.generator, "first_seed": args.first_seed, "n": args.n,
            "dimensions": {name: dims[name] for name in sorted({n for n, _ in KNOBS} | set(EVENTS))}, "pairs": {f"{a} + {b}": c for (a, b), c in sorted(pairs.items())}},
            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
