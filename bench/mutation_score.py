"""Mutation score: plant each bug of fuzz/mutants.py into the installed vLLM (in the worker
processes only), fuzz `--split fixed` from an empty corpus (known regression and upstream
signatures do not count), and report which mutants the
fuzzer kills, how fast, and with what signature. A finding kills a mutant only when it fails
with the mutant and replays clean without it (`fuzz.mutants.confirms_kill`, in this process);
a first finding that does not is reported as `unconfirmed`, not as a kill.

    python bench/mutation_score.py [--engines random atheris] [--seeds 3] [--max-time 60] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def hunt(mutant: str, engine: str, seed: int, max_time: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, MAMBAFUZZ_MUTANT="" if mutant == "none" else mutant)
        proc = subprocess.run(
            [sys.executable, "-m", "fuzz.cli", "fuzz", "--split", "fixed", "--engine", engine, "--seed", str(seed),
             "--max-time", str(max_time), "--stop-on-first", "--seeds", "--quiet",
             "--known", "corpus/regressions", "corpus/upstream",
             "--corpus", f"{tmp}/corpus", "--findings", f"{tmp}/findings", "--minimize-budget", "10"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=max_time + 240)
        files = sorted(Path(tmp, "findings").glob("*.json"))
        if proc.returncode != 1 or not files:
            return {"mutant": mutant, "engine": engine, "seed": seed, "killed": False}
        meta = json.loads(files[0].read_text())["finding"]
        row = {"mutant": mutant, "engine": engine, "seed": seed, "killed": True, "signature": meta["signature"],
               "seconds": meta["origin"].get("seconds"), "execs": meta["origin"].get("execs"),
               "min_requests": meta["minimized"]["requests"]}
        if mutant != "none":  # the control has no planted bug to confirm: any finding is a false positive
            from fuzz.corpus import load_case
            from fuzz.mutants import confirms_kill

            ok, why = confirms_kill(load_case(files[0]).scenario, "fixed", mutant, meta["signature"])
            row.update(killed=ok, confirmation=why, unconfirmed=not ok)
        return row


def main() -> int:
    from fuzz.mutants import MUTANTS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", nargs="+", default=["random", "atheris"])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--max-time", type=float, default=60)
    p.add_argument("--mutants", nargs="*", default=["none", *MUTANTS],
                   help="'none' is the control: the unmodified vLLM must not be 'killed'")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args()
    rows = []
    for name in args.mutants:
        for engine in args.engines:
            for seed in range(1, args.seeds + 1):
                r = hunt(name, engine, seed, args.max_time)
                rows.append(r)
                print(f"  {name:32} {engine:8} seed {seed}: " + (
                    f"killed in {r['seconds']}s ({r['execs']} execs) as {r['signature']}" if r["killed"]
                    else f"unconfirmed {r['signature']}: {r['confirmation']}" if r.get("unconfirmed")
                    else f"survived {args.max_time:.0f}s"), flush=True)
    print(f"\nmutation score ({args.seeds} seeds x {args.max_time:.0f}s, empty corpus, --split fixed)")
    print(f"{'mutant':32} " + " ".join(f"{e + ' kills':>14} {'median s':>9}" for e in args.engines) + "  description")
    for name in args.mutants:
        cells = []
        for engine in args.engines:
            rs = [r for r in rows if r["mutant"] == name and r["engine"] == engine]
            k = [r for r in rs if r["killed"]]
            med = f"{statistics.median(r['seconds'] for r in k):.1f}" if k else "-"
            cells.append(f"{len(k)}/{len(rs):<12} {med:>9}")
        desc = "control: unmodified vLLM (a kill here is a false positive)" if name == "none" else MUTANTS[name][0]
        print(f"{name:32} " + " ".join(cells) + f"  {desc}")
    for engine in args.engines:
        killed = {r["mutant"] for r in rows if r["engine"] == engine and r["killed"] and r["mutant"] != "none"}
        planted = [m for m in args.mutants if m != "none"]
        unconfirmed = sum(r.get("unconfirmed", False) for r in rows if r["engine"] == engine)
        print(f"{engine}: {len(killed)}/{len(planted)} planted mutants killed at least once "
              f"({unconfirmed} first findings did not confirm the planted bug and count as survived)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
