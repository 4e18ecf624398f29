"""What one of the generator's draws buys, in planted bugs found per execution: for the random
generator's seeds S..S+N-1, the scenarios the draw changes are run with it and without it (the
same seed; the late draws after it left out of both), clean and under each planted bug
(mambafuzz.tools.mutation.planted), and a planted
bug counts as detected in a scenario when the scenario has a finding under it and none without it
(what a campaign would file as new). Scenarios the draw leaves alone detect the same with it and
without it, so the difference between the two columns is the draw's whole effect on the random
generator's per-execution chance of finding each bug (its expected executions to a kill are the
inverse of that chance).

    python bench/draw_detection.py [--draw _draw_decode_pressure] [--seeds 900] [--first-seed S]
                                   [--mutants NAME ...] [--cost]

`--cost` instead times the fuzzer's evaluation (`evaluate`, both runs and the oracles) of every
seed's scenario with the draw and without it, interleaved in this process (CPU time, each timed
after an untimed run of both, so neither pays for building a config the other reuses), and prints
the ratio: what the draw costs in executions per second.

Nothing is asserted; the figures go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draw", default="_draw_decode_pressure", help="the generator's draw to switch off "
                    "(a function of mambafuzz.model.generate; default _draw_decode_pressure)")
    ap.add_argument("--seeds", type=int, default=900)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--mutants", nargs="*", help="planted bugs (names in mambafuzz.tools.mutation.planted) or "
                    "generated mutants (mm:Class.function:n) to measure (default: every planted bug)")
    ap.add_argument("--cost", action="store_true", help="time evaluate() with and without the draw instead")
    args = ap.parse_args(argv)
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.model import generate
    from mambafuzz.model.scenario import validate
    from mambafuzz.sim import patching
    from mambafuzz.tools.mutation import planted, planting

    if args.draw not in generate.LATE_DRAWS:
        print(f"draw_detection: {args.draw!r} is not one of the generator's late draws "
              f"({', '.join(generate.LATE_DRAWS)})", file=sys.stderr)
        return 2
    names = args.mutants or sorted(planted.MUTANTS)
    unknown = [n for n in names if n not in planted.MUTANTS and not n.startswith("mm:")]
    if unknown or args.seeds < 1:
        print(f"draw_detection: unknown planted bug(s) {', '.join(unknown)}" if unknown else
              "draw_detection: --seeds must be at least 1", file=sys.stderr)
        return 2

    def signatures(s, mutant: str | None) -> frozenset[str]:
        with patching.applied(planting.patches(mutant) if mutant else []):
            return frozenset(f.signature for f in evaluate(s, "fixed", efficiency=False).verdict.findings)

    # the late draws after it read another part of the input once it is off: left out of both runs,
    # so the two differ by the draw alone
    later = generate.draws_from(args.draw)[1:]

    def drawn(seed: int, with_draw: bool):
        first = (later[0] if later else None) if with_draw else args.draw
        with generate.late_draws_left_out(first):
            return generate.random_scenario(random.Random(seed))

    if args.cost:
        spent = {True: 0.0, False: 0.0}
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            pair = {}
            for flag in (True, False):
                s = drawn(seed, flag)
                if validate(s):  # its problems (it raises nothing): the fuzzer skips such a draw
                    continue
                pair[flag] = s
                evaluate(s, "fixed", efficiency=False)  # untimed: the configs either one builds are cached now
            for flag, s in pair.items():
                t = time.process_time()
                evaluate(s, "fixed", efficiency=False)
                spent[flag] += time.process_time() - t
        print(f"seeds {args.first_seed}..{args.first_seed + args.seeds - 1}: evaluate() CPU time with {args.draw} "
              f"{spent[True]:.1f} s, without {spent[False]:.1f} s: {spent[True] / spent[False]:.3f}x")
        return 0
    found = {True: Counter(), False: Counter()}
    changed = valid = 0
    t0 = time.monotonic()
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        pair = {flag: drawn(seed, flag) for flag in (True, False)}
        if pair[True] == pair[False]:
            continue
        changed += 1
        for flag, s in pair.items():
            if validate(s):
                continue
            valid += 1
            clean = signatures(s, None)
            for name in names:
                if signatures(s, name) - clean:
                    found[flag][name] += 1
        if changed % 20 == 0:
            print(f"[{time.monotonic() - t0:6.0f}s] {changed} changed scenarios", file=sys.stderr)
    print(f"seeds {args.first_seed}..{args.first_seed + args.seeds - 1}: {args.draw} changes {changed} scenarios "
          f"({valid} valid runs of them with and without it), {time.monotonic() - t0:.0f} s")
    print(f"{'planted bug':44s} {'with':>5s} {'without':>7s}   (changed scenarios with a new finding under it)")
    for name in names:
        w, wo = found[True][name], found[False][name]
        print(f"{name:44s} {w:5d} {wo:7d}{'   +' if w > wo else '   -' if w < wo else ''}")
    print(f"total detections: {sum(found[True].values())} with, {sum(found[False].values())} without")
    return 0


if __name__ == "__main__":
    sys.exit(main())
