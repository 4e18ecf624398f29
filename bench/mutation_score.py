"""Mutation score and attributed time to bug: plant each bug of mambafuzz/tools/mutation/planted.py into the
installed vLLM (in the worker processes only), fuzz `--split fixed` from an empty corpus
with each generator and several seeds, and report, per planted bug and generator, how many
hunts found it and the time and executions to the first *attributed* finding.

A finding is attributed to the planted bug only when it fails with the mutant and replays
clean without it (`mambafuzz.tools.mutation.kills.confirms_kill`, run in this process, where nothing is
planted), as FuzzBench and Magma attribute bugs. Known upstream behaviours are explained by
their candidate fixes (`--known corpus/regressions corpus/upstream`: a finding a known fix
explains is a duplicate, and the hunt goes on). A first finding that does not confirm the
planted bug is `unconfirmed` and the hunt counts as not found. A campaign that ends with a
tool error (exit 3, or 2 for arguments `fuzz` refuses) is `tool-error`, never a kill.

    python bench/mutation_score.py [--generators atheris hypothesis random] [--seeds 5]
        [--max-time 30] [--mutants NAME ...] [--parallel 2] [--base installed] [--jsonl OUT.jsonl]

`--jsonl` appends one line per hunt and skips hunts already in the file, so an interrupted
run resumes where it stopped. "fuzz s" counts from the worker being ready to run inputs;
"wall s" includes starting `mambafuzz` (importing vLLM, and instrumenting for atheris).
Executions are the load-independent measure; seconds depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mambafuzz.search import generators  # noqa: E402  (imports no vLLM)

INTERRUPTED = {130, -2, -9, -15, 137, 143}
CONFIRM_LOCK = threading.Lock()


def hunt(mutant: str, generator: str, seed: int, max_time: float, base: str | None = None) -> dict:
    """One campaign from an empty corpus, stopped at the first filed finding (with `base`, the first
    one that base does not show: `fuzz --base`, the PR job's rule)."""
    row: dict = {"mutant": mutant, "generator": generator, "seed": seed, "killed": False, "max_time": max_time,
                 **({"base": base} if base else {})}
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, MAMBAFUZZ_MUTANT="" if mutant == "none" else mutant)
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "mambafuzz.cli.main", "fuzz", "--split", "fixed", "--generator", generator,
             "--seed", str(seed), "--max-time", str(max_time), "--stop-on-first", "--seeds", "--quiet",
             "--known", "corpus/regressions", "corpus/upstream",
             "--corpus", f"{tmp}/corpus", "--findings", f"{tmp}/findings", "--minimize-budget", "5",
             *(["--base", base] if base else [])],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=max_time + 300)
        row["wall"] = round(time.monotonic() - start, 1)
        if proc.returncode in INTERRUPTED:  # stopped from outside: no result, and nothing to record
            return {**row, "interrupted": True}
        if proc.returncode not in (0, 1):  # 3: a tool error; 2: a usage error; no campaign ran either way
            tail = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""])[-1]
            return {**row, "tool_error": tail[:300]}
        files = sorted(Path(tmp, "findings").glob("*.json"))
        if proc.returncode != 1 or not files:
            return row
        meta = json.loads(files[0].read_text())["finding"]
        row.update(signature=meta["signature"], seconds=meta["origin"].get("seconds"),
                   execs=meta["origin"].get("execs"))
        if mutant == "none":  # the control has no planted bug to confirm: any finding is a false positive
            return {**row, "killed": True}
        from mambafuzz.search.pr.efficiency_gate import confirms_finding
        from mambafuzz.store.corpus import load_case

        with CONFIRM_LOCK:  # patching vLLM is process-wide: two confirmations at once undo each other
            # an efficiency-gate finding (--base) is confirmed on its figures, the others by the oracles
            ok, why = confirms_finding(load_case(files[0]).scenario, mutant, meta["signature"])
        return {**row, "killed": ok, "confirmation": why, "unconfirmed": not ok}


def describe(r: dict) -> str:
    if r["killed"]:
        return f"found in {r['seconds']}s fuzz / {r['wall']}s wall ({r['execs']} execs) as {r['signature']}"
    if r.get("tool_error"):
        return f"tool error: {r['tool_error']}"
    if r.get("unconfirmed"):
        return f"unconfirmed {r['signature']}: {r['confirmation']}"
    return f"survived {r['max_time']:.0f}s"


def median(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f}" if values else "-"


def table(rows: list[dict], mutants: list[str], generators: list[str]) -> str:
    from mambafuzz.tools.mutation.planted import MUTANTS

    out = [f"{'mutant':32} " + " ".join(f"{g:>10} {'fuzz s':>7} {'wall s':>7} {'execs':>7}" for g in generators)]
    for name in mutants:
        cells = []
        for g in generators:
            rs = [r for r in rows if r["mutant"] == name and r["generator"] == g]
            k = [r for r in rs if r["killed"]]
            tools = sum(bool(r.get("tool_error")) for r in rs)
            found = f"{len(k)}/{len(rs)}" + ("T" if tools else "")
            cells.append(f"{found:>10} {median([r['seconds'] for r in k]):>7} {median([r['wall'] for r in k]):>7} "
                         f"{median([r['execs'] for r in k], 0):>7}")
        desc = "control: unmodified vLLM (a kill is a false positive)" if name == "none" else MUTANTS[name][0]
        out.append(f"{name:32} " + " ".join(cells) + f"  {desc}")
    return "\n".join(out)


def ranking(rows: list[dict], mutants: list[str], generators: list[str]) -> list[tuple[str, int, float, float]]:
    """Per generator: hunts that found their bug, and the median over planted bugs of the median
    wall seconds to an attributed finding (a hunt that found nothing counts as its whole length)."""
    ranks = []
    planted = [m for m in mutants if m != "none"]
    for g in generators:
        found = sum(r["killed"] for r in rows if r["generator"] == g and r["mutant"] != "none")
        per_bug_wall, per_bug_execs = [], []
        for m in planted:
            rs = [r for r in rows if r["mutant"] == m and r["generator"] == g]
            if not rs:
                continue
            walls = [r["wall"] for r in rs]  # a miss counts as the whole hunt: censored at the budget
            per_bug_wall.append(statistics.median(walls))
            k = [r["execs"] for r in rs if r["killed"]]
            per_bug_execs.append(statistics.median(k) if len(k) * 2 > len(rs) else float("inf"))
        ranks.append((g, found, statistics.median(per_bug_wall) if per_bug_wall else float("nan"),
                      statistics.median(per_bug_execs) if per_bug_execs else float("nan")))
    return sorted(ranks, key=lambda t: (-t[1], t[2]))


def main() -> int:
    from mambafuzz.tools.mutation.planted import MUTANTS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generators", "--engines", dest="generators", nargs="+", default=list(generators.names()),
                   choices=generators.names())
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--control-seeds", type=int, default=1, help="seeds for the unmodified control per generator")
    p.add_argument("--max-time", type=float, default=30)
    p.add_argument("--mutants", nargs="*", default=["none", *MUTANTS],
                   help="'none' is the control: the unmodified vLLM must not be 'killed'")
    p.add_argument("--parallel", type=int, default=1, help="hunts at once (each is one process)")
    p.add_argument("--base", metavar="VLLM", help="PR mode (`fuzz --base VLLM`, e.g. installed): a hunt goes on "
                   "past findings unmodified vLLM shows too (its open candidates) instead of stopping there")
    p.add_argument("--jsonl", metavar="OUT", help="append a line per hunt; hunts already there are not re-run")
    p.add_argument("--json", metavar="OUT", help="write every row as one JSON list at the end")
    args = p.parse_args()
    unknown = [m for m in args.mutants if m != "none" and m not in MUTANTS]
    if unknown or args.seeds < 1 or args.max_time <= 0 or args.parallel < 1:
        print(f"mutation_score: bad arguments: unknown mutants {unknown}" if unknown
              else "mutation_score: --seeds, --max-time and --parallel must be positive", file=sys.stderr)
        return 2
    if args.base:
        from mambafuzz.exit_codes import UsageError
        from mambafuzz.search.pr.base_process import check_where  # imports no vLLM

        try:
            check_where(args.base)
        except UsageError as exc:
            print(f"mutation_score: {exc}", file=sys.stderr)
            return 2
    done: list[dict] = []
    if args.jsonl and Path(args.jsonl).exists():
        done = [json.loads(line) for line in Path(args.jsonl).read_text().splitlines() if line.strip()]
    have = {(r["mutant"], r["generator"], r["seed"], r["max_time"]) for r in done if r.get("base") == args.base}
    todo = [(m, g, s) for m in args.mutants for g in args.generators
            for s in range(1, (args.control_seeds if m == "none" else args.seeds) + 1)
            if (m, g, s, args.max_time) not in have]
    rows = [r for r in done if r["max_time"] == args.max_time and r["mutant"] in args.mutants
            and r["generator"] in args.generators and r.get("base") == args.base]
    print(f"{len(todo)} hunts to run ({len(rows)} already in {args.jsonl})" if args.jsonl else f"{len(todo)} hunts",
          flush=True)
    try:
        with ThreadPoolExecutor(args.parallel) as pool:
            for r in pool.map(lambda t: hunt(*t, args.max_time, args.base), todo):
                if r.get("interrupted"):
                    continue
                rows.append(r)
                print(f"  {r['mutant']:32} {r['generator']:10} seed {r['seed']}: {describe(r)}", flush=True)
                if args.jsonl:
                    with open(args.jsonl, "a") as f:
                        f.write(json.dumps(r) + "\n")
    except KeyboardInterrupt:
        print("interrupted: the table below has the hunts that finished", file=sys.stderr)
    print(f"\nattributed time to bug ({args.seeds} seeds x {args.max_time:.0f}s, empty corpus, --split fixed); "
          "found/hunts (T: some hunt ended in a tool error), medians over the hunts that found it")
    print(table(rows, args.mutants, args.generators))
    planted = [m for m in args.mutants if m != "none"]
    print()
    for g, found, wall, execs in ranking(rows, args.mutants, args.generators):
        killed = {r["mutant"] for r in rows if r["generator"] == g and r["killed"] and r["mutant"] != "none"}
        false = sum(r["killed"] for r in rows if r["generator"] == g and r["mutant"] == "none")
        unconfirmed = sum(bool(r.get("unconfirmed")) for r in rows if r["generator"] == g)
        print(f"{g:10}: {len(killed)}/{len(planted)} planted bugs found at least once, {found} attributed hunts; "
              f"median per-bug wall s to bug {wall:.1f} (a miss counts as its whole hunt), median per-bug execs "
              f"{execs:.0f} (inf: found in under half the seeds); {unconfirmed} unconfirmed first findings; "
              f"control false kills: {false}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
