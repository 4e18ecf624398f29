"""The mutation run's rows as a table: each mutant's outcome (killed / unconfirmed / tool-error),
or a survivor's hand classification (equivalent / efficiency / unreachable / missed, from
bench/mutation_classes.json), per function. A classification is keyed by the function's source
digest, so a changed vLLM shows it as stale instead of reusing it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

COLUMNS = ["killed", "equivalent", "efficiency", "unreachable", "missed", "unclassified", "unconfirmed",
           "tool-error", "stale"]


def load_classes(path: Path) -> dict:
    """The hand classifications of survivors, by mutant id ({} when there is no file)."""
    return json.loads(path.read_text()) if path.exists() else {}


def classify(row: dict, classes: dict) -> str:
    """killed / unconfirmed / tool-error, or a survivor's hand classification (stale when the
    function's source changed since it was classified, unclassified when there is none)."""
    if row["status"] != "survived":
        return row["status"]
    c = classes.get(row["id"])
    if c is None:
        return "unclassified"
    return c["class"] if c.get("digest") == row["digest"] else "stale"


def table(rows: list[dict], generated: Counter, classes: dict) -> str:
    """Per function (generated: mutants per function): how many ran and each column's count."""
    out = [f"{'function':42} {'generated':>9} {'run':>4} " + " ".join(f"{c:>12}" for c in COLUMNS)
           + f" {'hidden-by-fixes':>15}"]
    total: Counter = Counter()
    for fn in sorted(generated):
        rs = [r for r in rows if r["function"] == fn]
        c = Counter(classify(r, classes) for r in rs)
        hidden = sum(bool(r.get("hidden_by_known_fixes")) for r in rs)
        total.update(c)
        total["run"] += len(rs)
        total["hidden"] += hidden
        total["generated"] += generated[fn]
        out.append(f"{fn:42} {generated[fn]:>9} {len(rs):>4} " + " ".join(f"{c[k]:>12}" for k in COLUMNS) + f" {hidden:>15}")
    out.append(f"{'total':42} {total['generated']:>9} {total['run']:>4} " + " ".join(f"{total[k]:>12}" for k in COLUMNS)
               + f" {total['hidden']:>15}")
    return "\n".join(out)


def last_row_per_mutant(paths: list[str], generator: str, functions: set[str]) -> list[dict]:
    """The rows of `paths`, in order, of `generator` and of `functions`; a mutant's later row
    replaces its earlier one (a re-run of survivors on an unchanging checkout supersedes a run
    whose survivors were not trustworthy, docs/MUTATION.md)."""
    rows: dict[str, dict] = {}
    for path in paths:
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if line.strip():
                r = json.loads(line)
                if not isinstance(r, dict) or not {"id", "generator", "function"} <= r.keys():
                    raise ValueError(f"{path}:{n}: not a mutation_run row (id, generator, function)")
                if r["generator"] == generator and r["function"] in functions:
                    rows.pop(r["id"], None)
                    rows[r["id"]] = r
    return list(rows.values())
