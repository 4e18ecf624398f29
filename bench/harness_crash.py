"""Harness-crash campaign: can a buggy vLLM stop a fuzz worker? Plant each bug of
mambafuzz/tools/mutation/planted.py in turn, fuzz `--split fixed` from an empty corpus with no known bugs
(every violation is filed), and count what must stay 0: worker deaths and tool failures (inputs
kept under findings/tool-errors/). Contract findings (`SchedulerContract@scheduler-output|rule`)
are listed: each rule needs a test in tests/.

    python bench/harness_crash.py [--max-time 45] [--mutants NAME ...] [--seed 11]

Exit 1 when any worker died or any tool failure was counted, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEATH = re.compile(r"died \(exit|cannot run:|before it started")


def hunt(mutant: str, max_time: float, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "mambafuzz.cli.main", "fuzz", "--split", "fixed", "--max-time", str(max_time),
             "--seed", str(seed), "--seeds", "--known", "--quiet", "--minimize-budget", "1",
             "--corpus", f"{tmp}/corpus", "--findings", f"{tmp}/findings"],
            cwd=ROOT, env=dict(os.environ, MAMBAFUZZ_MUTANT=mutant), capture_output=True, text=True,
            timeout=max_time + 600)
        execs = re.search(r"summary: (\d+) executions", proc.stdout)
        contracts = set()
        for p in Path(tmp, "findings").glob("*.json"):
            fine = json.loads(p.read_text()).get("finding", {}).get("fine_signature", "")
            if "SchedulerContract" in fine:
                contracts.add(fine.split(":", 1)[1])
        return {"mutant": mutant, "exit": proc.returncode, "execs": int(execs[1]) if execs else 0,
                "tool_failures": len(list(Path(tmp, "findings", "tool-errors").glob("*.json"))),
                "worker_deaths": len(DEATH.findall(proc.stderr)), "contracts": sorted(contracts)}


def main() -> int:
    from mambafuzz.tools.mutation.planted import MUTANTS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-time", type=float, default=45.0)
    p.add_argument("--mutants", nargs="*", default=sorted(MUTANTS))
    p.add_argument("--seed", type=int, default=11)
    args = p.parse_args()
    unknown = [m for m in args.mutants if m not in MUTANTS]
    if unknown:
        print(f"harness_crash: unknown mutant {unknown[0]!r}", file=sys.stderr)
        return 2
    rows = []
    for m in args.mutants:
        rows.append(hunt(m, args.max_time, args.seed))
        r = rows[-1]
        print(f"{m:32} exit {r['exit']}  execs {r['execs']:5}  tool failures {r['tool_failures']}  "
              f"worker deaths {r['worker_deaths']}  {' '.join(r['contracts'])}", flush=True)
    bad = sum(r["tool_failures"] + r["worker_deaths"] for r in rows)
    print(f"{len(rows)} mutants, {sum(r['execs'] for r in rows)} executions, "
          f"{sum(r['tool_failures'] for r in rows)} tool failures, {sum(r['worker_deaths'] for r in rows)} worker deaths")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
