"""Time-to-bug benchmark, FuzzBench style: for each known-bad split and each generator, fuzz
from an empty corpus (no seeds, no known signatures) with several seeds, stop at the first
finding, and print median/max time and executions to it, plus the minimized case's size and
the time minimization took.  Also measures each generator's exec/s on `fixed`, and optionally
the --jobs 2 speed-up.

    python bench/time_to_bug.py [--seeds 5] [--max-time 120] [--splits prefix realign]
                                [--generators atheris hypothesis random] [--exec-rate-seconds 30]
                                [--jobs-speedup] [--json OUT]

A finding counts as the planted bug (the known-bad split) only when it fails under that split
and replays clean under the installed one (`fixed`); any other first finding (an upstream bug,
which fails under `fixed` too) is reported as `unconfirmed` and the hunt as not found.

Times: "wall" is from starting `mambafuzz fuzz` (includes ~7 s of importing vLLM); "fuzz" is
from the worker being ready to run inputs (what the generator itself took).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mambafuzz.search import generators  # noqa: E402  (imports no vLLM)


def fuzz(args: list[str], cwd: Path, timeout: float) -> tuple[int, str, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mambafuzz.cli.main", "fuzz", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def one_hunt(split: str, generator: str, seed: int, max_time: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rc, out, wall = fuzz(["--split", split, "--generator", generator, "--seed", str(seed), "--max-time", str(max_time),
                              "--stop-on-first", "--corpus", str(tmp / "corpus"), "--seeds", "--known",
                              "--findings", str(tmp / "findings"), "--quiet"], ROOT, max_time + 180)
        found = re.search(r"^\[\s*([\d.]+)s\] FOUND (\S+)", out, re.M)
        files = sorted((tmp / "findings").glob("*.json"))
        if rc != 1 or not found or not files:
            return {"split": split, "generator": generator, "seed": seed, "found": False, "wall": wall}
        case = json.loads(files[0].read_text())
        meta = case["finding"]
        ok, why = confirms_split_bug(files[0], split)
        if not ok:
            return {"split": split, "generator": generator, "seed": seed, "found": False, "wall": wall,
                    "unconfirmed": found.group(2), "confirmation": why}
        return {
            "split": split, "generator": generator, "seed": seed, "found": True,
            "signature": found.group(2), "wall_to_found": float(found.group(1)),
            "fuzz_seconds": meta["origin"].get("seconds"), "execs": meta["origin"].get("execs"),
            "min_requests": meta["minimized"]["requests"], "min_steps": meta["minimized"]["last_step"],
            "min_tokens": meta["minimized"]["tokens"], "min_seconds": meta["minimized"]["seconds"],
            "input": meta["origin"].get("input"),
        }


def confirms_split_bug(path: Path, split: str) -> tuple[bool, str]:
    """Fails under `split`, clean under the installed split: the planted (split) bug itself."""
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.store.corpus import load_case

    scenario = load_case(path).scenario
    if evaluate(scenario, split, efficiency=False).verdict.clean:
        return False, f"clean under {split}"
    other = evaluate(scenario, "fixed", efficiency=False).verdict
    if not other.clean:
        return False, f"fails under fixed too ({other.primary.signature})"
    return True, "fails under the split, clean under fixed"


def exec_rate(generator: str, seconds: float, jobs: int = 1) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        _, out, _ = fuzz(["--split", "fixed", "--generator", generator, "--max-time", str(seconds), "--jobs", str(jobs),
                          "--corpus", str(tmp / "c"), "--seeds", "--known", "corpus/regressions", "corpus/upstream",
                          "--findings", str(tmp / "f")],
                         ROOT, seconds + 300)
        m = re.search(r"summary: (\d+) executions", out)
        lines = [ln for ln in out.splitlines() if " execs " in ln]
        # rate over the fuzzing window: executions / max-time (start-up excluded)
        return int(m.group(1)) / seconds if m else float("nan"), lines[-1] if lines else ""


def fmt(values: list[float], digits: int = 1) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.{digits}f} / {max(values):.{digits}f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--max-time", type=float, default=120)
    p.add_argument("--splits", nargs="+", default=["prefix", "realign"])
    p.add_argument("--generators", "--engines", dest="generators", nargs="+", default=list(generators.names()),
                   choices=generators.names(), help="default: every registered one (--engines is the old name)")
    p.add_argument("--exec-rate-seconds", type=float, default=30)
    p.add_argument("--jobs-speedup", action="store_true")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args()

    results = []
    for split in args.splits:
        for generator in args.generators:
            for seed in range(1, args.seeds + 1):
                r = one_hunt(split, generator, seed, args.max_time)
                results.append(r)
                print(f"  {split:8} {generator:10} seed {seed}: "
                      + (f"{r['signature']} after {r['fuzz_seconds']}s fuzz / {r['wall_to_found']}s wall, "
                         f"{r['execs']} execs; minimized to {r['min_requests']} req {r['min_tokens']} tok "
                         f"in {r['min_seconds']}s" if r["found"]
                         else f"unconfirmed {r['unconfirmed']}: {r['confirmation']}" if r.get("unconfirmed")
                         else f"nothing in {args.max_time}s"),
                      flush=True)

    print("\ntime to first finding, from an empty corpus "
          f"({args.seeds} seeds, budget {args.max_time:.0f}s each); median / max")
    head = f"{'split':8} {'generator':10} {'found':>6} {'fuzz s':>13} {'wall s':>13} {'execs':>13} " \
           f"{'min req':>8} {'min tok':>9} {'min s':>11}"
    print(head)
    for split in args.splits:
        for generator in args.generators:
            rs = [r for r in results if r["split"] == split and r["generator"] == generator]
            ok = [r for r in rs if r["found"]]
            print(f"{split:8} {generator:10} {len(ok)}/{len(rs):<4} {fmt([r['fuzz_seconds'] for r in ok]):>13} "
                  f"{fmt([r['wall_to_found'] for r in ok]):>13} {fmt([r['execs'] for r in ok], 0):>13} "
                  f"{fmt([r['min_requests'] for r in ok], 0):>8} {fmt([r['min_tokens'] for r in ok], 0):>9} "
                  f"{fmt([r['min_seconds'] for r in ok]):>11}")

    rates = {}
    if args.exec_rate_seconds:
        print(f"\nexec/s on split fixed ({args.exec_rate_seconds:.0f}s each, one job)")
        for generator in args.generators:
            rates[generator], last = exec_rate(generator, args.exec_rate_seconds)
            print(f"  {generator:10} {rates[generator]:7.1f} exec/s   ({last.strip()})")
    speedup = None
    if args.jobs_speedup:
        one, _ = exec_rate("random", 60, 1)
        two, _ = exec_rate("random", 60, 2)
        speedup = two / one
        print(f"\n--jobs 2 vs 1 (random generator, fixed, 60s): {two:.1f} vs {one:.1f} exec/s = {speedup:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"hunts": results, "exec_rates": rates, "jobs2_speedup": speedup},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
