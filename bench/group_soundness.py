"""Grouping on planted bugs' findings: groups per bug, and whether a group mixes two bugs.

    python bench/group_soundness.py --mutants A[,B] FINDINGS_DIR...

Each FINDINGS_DIR holds one planted bug's minimized findings (as `ci/pr-fuzz` writes them, a
`log.txt` beside it giving the discovery order); the bug is the directory's parent's name
without a `remin_new_` prefix. The PR's vLLM is the installed one with every mutant named
planted (patches, in this process), the base the installed one; both sides run here, as the PR
job's base process would. Printed per rule (`symptom`: the rules without a base; `divergence`:
gated by the divergence key): findings, groups, groups per bug, groups mixing bugs by directory,
and groups mixing by cause: two members no single planted bug explains both of (for each finding,
the bugs that alone reproduce the signature it shows with all named bugs planted).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mambafuzz.checks.pipeline import signature_of  # noqa: E402
from mambafuzz.search.pr import grouping  # noqa: E402
from mambafuzz.search.pr.base_process import observe  # noqa: E402
from mambafuzz.search.pr.divergence import key  # noqa: E402
from mambafuzz.tools.mutation import planting  # noqa: E402


def bug_of(path: str) -> str:
    return Path(path).parent.parent.name.removeprefix("remin_new_")


def discovery_order(dirs: list[Path]) -> list[grouping.Member]:
    order = []
    for d in dirs:
        log = d.parent / "log.txt"
        for line in (log.read_text().splitlines() if log.exists() else []):
            found = re.search(r"FOUND \S+ reproduced \S+ -> (\S+)", line)
            if found:
                order.append((d.parent.name, Path(found.group(1)).name))
    found = grouping.members(dirs)
    rank = {k: i for i, k in enumerate(order)}
    return sorted(found, key=lambda m: rank.get((m.path.parent.parent.name, m.path.name), len(rank)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", required=True)
    ap.add_argument("dirs", nargs="+", type=Path)
    args = ap.parse_args()
    names = args.mutants.split(",")
    planted = [p for n in names for p in planting.patches(n)]
    found = discovery_order(args.dirs)
    keys = {m.path: key(observe(m.scenario, "fixed", planted), observe(m.scenario, "fixed")) for m in found}
    alone = {}
    for m in found:
        shown = signature_of(m.scenario, "fixed", planted)
        alone[str(m.path)] = {n for n in names if signature_of(m.scenario, "fixed", planting.patches(n)) == shown}
    print("keys:", dict(Counter((bug_of(str(m.path)), keys[m.path]) for m in found)))

    def replay(scenario, split):
        return signature_of(scenario, split, planted)

    for rule, divergence in (("symptom", None), ("divergence", lambda m: keys[m.path])):
        groups = grouping.group(found, replay, divergence)
        per_bug = Counter(b for g in groups for b in {bug_of(m["path"]) for m in g["members"]})
        mixing = sum(len({bug_of(m["path"]) for m in g["members"]}) > 1 for g in groups)
        by_cause = 0
        for g in groups:
            causes = [alone[m["path"]] for m in g["members"] if alone[m["path"]]]
            by_cause += bool(causes) and not set.intersection(*causes)
        print(f"{rule}: {len(found)} findings -> {len(groups)} groups; per bug {dict(sorted(per_bug.items()))}; "
              f"{mixing} mixing bugs by directory, {by_cause} by cause")
        for g in groups:
            if len({bug_of(m["path"]) for m in g["members"]}) > 1:
                for m in g["members"]:
                    print(f"    {bug_of(m['path'])}  {m['signature']}  key={m.get('divergence')}  "
                          f"alone={sorted(alone[m['path']])}  {m['why']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
