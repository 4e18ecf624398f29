"""Systematic mutation analysis: for each generated first-order mutant of vLLM's mamba
scheduling code (mambafuzz/tools/mutation/operators.py, mutmut's operators), run one time-boxed
`python -m mambafuzz.cli fuzz --split fixed` from an empty corpus with the mutant planted in its
workers, and count a kill only when attributed: the first finding fails with the mutant and
replays clean without it (`kills.confirms_kill`, in this process, where nothing is planted).

For each kill it also replays the finding with the mutant plus every known fix (what
`--with-known-fixes` runs): `hidden_by_known_fixes` means that finding would not be seen there.
Survivors are classified by hand in bench/mutation_classes.json (equivalent / efficiency (the
outputs stay right, only cache efficiency changes, which campaigns do not judge) / unreachable /
missed, each with its argument and evidence), keyed by mutant id and the function's source digest, so a
changed vLLM shows a classification as stale instead of reusing it (mambafuzz/tools/mutation/tables.py).

    python bench/mutation_run.py --targets split [MambaManager coordinator allocate_slots get_computed_blocks
        schedule update_from_output ...] [--mutants ID ...]
        [--sample N [--sample-seed 21]] [--max-time 30] [--generator random] [--parallel 1] [--shard K/N] [--jsonl OUT]
        [--keep DIR] [--list [--statements]] [--table] [--replay-survivors DIR ...]

`--jsonl` appends one line per mutant and skips mutants already there (same id, digest,
generator and budget), so a run resumes; shards (`--shard K/N`, mutant index mod N) run on
different machines and their JSONL files concatenate. Exit 0 unless the arguments are bad (2).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mambafuzz.search import generators  # noqa: E402  (imports no vLLM)
from mambafuzz.tools.mutation import kills, tables  # noqa: E402  (imports no vLLM)

CLASSES = ROOT / "bench" / "mutation_classes.json"
KNOWN = ["corpus/regressions", "corpus/upstream"]
INTERRUPTED = {130, -2, -9, -15, 137, 143}
LOCK = threading.Lock()  # patching vLLM is process-wide: one replay at a time


def campaign(mutant_id: str, generator: str, max_time: float, minimize_budget: float, keep: str | None,
             base: str | None = None) -> dict:
    """One campaign from an empty corpus against the mutant, stopped at the first finding; with
    `base` (PR mode, `fuzz --base`) at the first finding its base does not show, so it goes on past
    unmodified vLLM's own findings, and the efficiency gate judges every input too."""
    row: dict = {"killed": False}
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, MAMBAFUZZ_MUTANT=mutant_id)
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "mambafuzz.cli", "fuzz", "--split", "fixed", "--generator", generator,
             "--max-time", str(max_time), "--stop-on-first", "--seeds", "--quiet", "--known", *KNOWN,
             "--corpus", f"{tmp}/corpus", "--findings", f"{tmp}/findings", "--minimize-budget", str(minimize_budget),
             *(["--base", base] if base else [])],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=max_time + 600)
        row["wall"] = round(time.monotonic() - start, 1)
        if proc.returncode in INTERRUPTED:
            return {**row, "status": "interrupted"}
        if proc.returncode not in (0, 1):  # 3: a tool error; 2: a usage error; no campaign ran either way
            tail = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""])[-1]
            return {**row, "status": "tool-error", "why": tail[:300]}
        files = sorted(Path(tmp, "findings").glob("*.json"))
        if proc.returncode != 1 or not files:
            return {**row, "status": "survived"}
        meta = json.loads(files[0].read_text())["finding"]
        row.update(signature=meta["signature"], seconds=meta["origin"].get("seconds"),
                   execs=meta["origin"].get("execs"))
        from mambafuzz.search.pr import efficiency_gate  # imports vLLM: only once a finding is confirmed
        from mambafuzz.store.corpus import load_case

        case = load_case(files[0])
        with LOCK:
            ok, why = efficiency_gate.confirms_finding(case.scenario, mutant_id, meta["signature"])
            # the oracles' replay says nothing of a gate kill (its figures need the base): not applicable
            gate = meta["signature"].startswith(f"{efficiency_gate.KIND}:")
            hidden = hidden_by_known_fixes(case.scenario, mutant_id) if ok and not gate else None
        status = "killed" if ok else "unconfirmed"
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            kept = Path(keep) / (mutant_id.replace(":", "_") + ".json")
            kept.write_text(files[0].read_text())
            row["finding"] = str(kept)
        return {**row, "killed": ok, "status": status, "why": why, "hidden_by_known_fixes": hidden}


def hidden_by_known_fixes(scenario, mutant_id: str) -> bool | None:
    """Is this finding clean with the mutant plus every known fix under KNOWN (`kills`)?"""
    return kills.hidden_by_known_fixes(scenario, mutant_id, [ROOT / d for d in KNOWN])


def replay_survivors(rows: list[dict], dirs: list[str]) -> dict[str, dict]:
    """Evidence for classifying each survivor, from every case under `dirs`
    (`kills.survivor_evidence` says what each key means), printed as each survivor is done."""
    out: dict[str, dict] = {}
    for r, e in kills.survivor_evidence(rows, dirs):
        out[r["id"]] = e
        print(f"  {r['id']:52} differs on {e['differs']}/{e['cases']}; kills: {e['kills']}; "
              f"efficiency: {e['efficiency']}" + (f"; RAISED on {e['raised']}: {e['raised_first']}" if e["raised"] else "")
              + f"  [{r['change'][:90]}]", flush=True)
    return out


def table(rows: list[dict], generated: Counter) -> str:
    return tables.table(rows, generated, tables.load_classes(CLASSES))


def print_list(mt, targets: list[str], chosen: list, with_statements: bool) -> None:
    """Per function: kept / generated (what the rule of `statements` selects of mutmut's mutants;
    `whole` when the function is kept whole), then each chosen mutant."""
    for t in mt.expand(targets):
        kept = len(mt.mutants_of(t))
        how = "whole" if mt.kept_whole(t) else "mamba statements"
        print(f"# {t.partition(':')[2]:58} {kept:4} of {mt.count_all(t):4} ({how}, digest {mt.digest(t)})")
        if with_statements and not mt.kept_whole(t):
            for line, k, text in mt.statements(t):
                print(f"#     {line:5} x{k:<3} {text[:110]}")
    for m in chosen:
        print(f"{m.id}  line {m.line}  {m.change[:150]}")


def main() -> int:
    from mambafuzz.tools.mutation import operators as mt

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", nargs="+", default=["split"], help=f"groups ({', '.join(mt.GROUPS)}) or Class.function")
    p.add_argument("--mutants", nargs="*", help="only these ids")
    p.add_argument("--sample", type=int, metavar="N", help="a fixed random sample of N of the chosen mutants")
    p.add_argument("--sample-seed", type=int, default=21)
    p.add_argument("--max-time", type=float, default=30)
    p.add_argument("--minimize-budget", type=float, default=5)
    p.add_argument("--generator", default=generators.DEFAULT, choices=generators.names())
    p.add_argument("--parallel", type=int, default=1, help="campaigns at once (each is two processes)")
    p.add_argument("--fork-server", action="store_true",
                   help="fork each campaign from one process that imported vLLM once (bench/mutation_forkserver.py): "
                        "saves ~15 s of start-up per mutant; the time box is then all fuzzing (random only)")
    p.add_argument("--shard", default="1/1", help="K/N: run the mutants whose index mod N is K-1")
    p.add_argument("--jsonl", metavar="OUT", help="append a line per mutant; resume from what is there")
    p.add_argument("--keep", metavar="DIR", help="copy each campaign's first finding here")
    p.add_argument("--base", metavar="VLLM", help="PR mode (`fuzz --base VLLM`, e.g. installed): stop at the first "
                   "finding the base does not show, with the efficiency gate on (not with --fork-server)")
    p.add_argument("--replay-survivors", nargs="+", metavar="DIR",
                   help="replay every case under DIRs against each survivor in --jsonl (no campaigns)")
    p.add_argument("--evidence", metavar="OUT", help="with --replay-survivors: also write the evidence per survivor as JSON")
    p.add_argument("--list", action="store_true",
                   help="list each function's count (kept of generated) and the mutants, and exit")
    p.add_argument("--statements", action="store_true",
                   help="with --list: also the lines of vLLM the kept mutants change, per function")
    p.add_argument("--table", action="store_true", help="only print the table of what --jsonl holds")
    p.add_argument("--table-from", nargs="+", metavar="JSONL",
                   help="only print one table of these runs' rows (any budget, the --generator's rows): a mutant's "
                        "last row counts, so a re-run of survivors listed after its first run supersedes it")
    args = p.parse_args()
    try:
        k, n = (int(x) for x in args.shard.split("/"))
        if not (1 <= k <= n) or args.max_time <= 0 or args.parallel < 1:
            raise ValueError
        every = mt.list_mutants(args.targets)
        chosen = [mt.find(i) for i in args.mutants] if args.mutants else every
    except (ValueError, mt.MutantError) as exc:
        print(f"mutation_run: {exc}" if str(exc) else "mutation_run: --shard K/N with 1<=K<=N, "
              "--max-time and --parallel positive", file=sys.stderr)
        return 2
    if args.sample is not None and args.sample < len(chosen):
        import random

        picked = set(random.Random(args.sample_seed).sample(range(len(chosen)), args.sample))
        chosen = [m for i, m in enumerate(chosen) if i in picked]
    chosen = [m for i, m in enumerate(chosen) if i % n == k - 1]
    if args.list:
        print_list(mt, args.targets, chosen, args.statements)
        return 0
    fn_of = {m.target: m.target.partition(":")[2] for m in every}
    generated = Counter(fn_of[m.target] for m in every)
    if args.table_from:
        try:
            combined = tables.last_row_per_mutant(args.table_from, args.generator, set(generated))
        except (OSError, ValueError) as exc:
            print(f"mutation_run: --table-from: {exc}", file=sys.stderr)
            return 2
        if not combined:
            print(f"mutation_run: --table-from: no {args.generator} rows of these targets in {' '.join(args.table_from)}",
                  file=sys.stderr)
            return 2
        budgets = Counter(f"{r['max_time']:g} s" for r in combined)
        print(f"{args.generator}, last row per mutant (budgets: {', '.join(f'{b} x{n}' for b, n in budgets.items())}), "
              "empty corpus, --split fixed, first finding attributed")
        print(table(combined, generated))
        return 0
    done = []
    if args.jsonl and Path(args.jsonl).exists():
        done = [json.loads(line) for line in Path(args.jsonl).read_text().splitlines() if line.strip()]
    key = lambda r: (r["id"], r["digest"], r["generator"], r["max_time"])  # noqa: E731
    have = {key(r) for r in done}
    todo = [m for m in chosen if (m.id, mt.digest(m.target), args.generator, args.max_time) not in have]
    rows = [r for r in done if r["generator"] == args.generator and r["max_time"] == args.max_time
            and r["function"] in generated]
    if args.replay_survivors:  # the chosen mutants' survivors only, so --shard splits this work too
        chosen_ids = {m.id for m in chosen}
        evidence = replay_survivors([r for r in rows if r["id"] in chosen_ids], args.replay_survivors)
        if args.evidence:
            Path(args.evidence).write_text(json.dumps(evidence, indent=1))
        return 0
    if args.fork_server and args.base:
        print("mutation_run: --base runs each campaign as `fuzz --base`; the fork server does not", file=sys.stderr)
        return 2
    if args.base:
        from mambafuzz.exit_codes import UsageError
        from mambafuzz.search.pr.base_process import check_where  # imports no vLLM

        try:
            check_where(args.base)
        except UsageError as exc:
            print(f"mutation_run: {exc}", file=sys.stderr)
            return 2
    if args.fork_server and args.generator != "random":
        print("mutation_run: --fork-server runs generators with their own loop only (random); libFuzzer "
              "re-executes its target", file=sys.stderr)
        return 2
    if not args.table:
        print(f"{len(todo)} mutants to run, {len(chosen) - len(todo)} already in {args.jsonl}", flush=True)

        def base(m) -> dict:
            return {"id": m.id, "function": fn_of[m.target], "line": m.line, "change": m.change,
                    "digest": mt.digest(m.target), "generator": args.generator, "max_time": args.max_time,
                    "load": os.getloadavg()[0], **({"fork_server": True} if args.fork_server else {})}

        def record(r: dict) -> None:
            rows.append(r)
            detail = (f"{r.get('seconds')}s {r.get('execs')} execs {r.get('signature')}"
                      + (" (hidden by known fixes)" if r.get("hidden_by_known_fixes") else "")
                      if r["killed"] else r.get("why", ""))
            print(f"  {r['id']:52} {r['status']:11} wall {r['wall']:5}s  {detail}  [{r['change'][:80]}]", flush=True)
            if args.jsonl:
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps(r) + "\n")
        try:
            if args.fork_server:
                import mutation_forkserver

                mutation_forkserver.warm()
                by_id = {m.id: m for m in todo}  # (the load average is taken as each campaign ends)
                for mutant_id, r in mutation_forkserver.run(
                        [m.id for m in todo], max_time=args.max_time, minimize_budget=args.minimize_budget,
                        known=KNOWN, keep=args.keep, parallel=args.parallel, hidden=hidden_by_known_fixes):
                    record({**base(by_id[mutant_id]), **r})
            else:
                def run(m):
                    return {**base(m), **campaign(m.id, args.generator, args.max_time, args.minimize_budget, args.keep,
                                                  args.base), **({"base": args.base} if args.base else {})}
                with ThreadPoolExecutor(args.parallel) as pool:
                    for r in pool.map(run, todo):
                        if r["status"] != "interrupted":
                            record(r)
        except KeyboardInterrupt:
            print("interrupted: the table has the mutants that finished", file=sys.stderr)
    forked = {bool(r.get("fork_server")) for r in rows} or {args.fork_server}
    how = ("fork server: the time box is all fuzzing" if forked == {True} else
           "a mambafuzz fuzz process each" if forked == {False} else "some forked, some a process each")
    print(f"\n{args.generator}, {args.max_time:.0f}s per mutant ({how}), empty corpus, --split fixed, "
          "first finding attributed")
    print(table(rows, generated))
    return 0


if __name__ == "__main__":
    sys.exit(main())
