"""Replays that decide what a case says about a mutant, in a process where no mutant is planted
(each replay plants its own, reversibly): whether a finding kills it (`confirms_kill`, the
honest part: it fails with the mutant and is clean without, as FuzzBench and Magma attribute
bugs), whether the known fixes would hide that finding, and what the kept cases say of a
survivor (`survivor_evidence`, for its hand classification).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from mambafuzz.tools.mutation import planting


def confirms_kill(scenario, split: str, name: str, signature: str | None = None) -> tuple[bool, str]:
    """Does `scenario` show the planted bug `name`: it fails with the mutant (with `signature`
    when given) and replays clean without it? Call in a process where no mutant is planted."""
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.model.scenario import ScenarioError
    from mambafuzz.sim import patching

    try:
        with_bug = evaluate(scenario, split, efficiency=False, patches=planting.patches(name)).verdict
        without = evaluate(scenario, split, efficiency=False).verdict
    except ScenarioError as exc:
        return False, f"rejected: {'; '.join(exc.problems)}"
    except patching.FixNotApplicable as exc:
        return False, f"mutant does not apply: {exc}"
    if with_bug.clean:
        return False, "clean with the mutant"
    if signature is not None and with_bug.primary.signature != signature:
        return False, f"fails with the mutant as {with_bug.primary.signature}, not {signature}"
    if not without.clean:
        return False, f"fails without the mutant too ({without.primary.signature}): not the planted bug"
    return True, f"fails with the mutant ({with_bug.primary.signature}), clean without"


def hidden_by_known_fixes(scenario, mutant_id: str, known_dirs: Sequence[Path]) -> bool | None:
    """Is this finding clean with the mutant plus every known fix under `known_dirs` (what
    `--with-known-fixes` runs)? A fix that does not apply on top of the mutant is skipped, as the
    worker does."""
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.sim import patching
    from mambafuzz.store.known_bugs import known_fix_bugs

    with contextlib.ExitStack() as stack:
        for p in planting.patches(mutant_id):
            stack.callback(patching.apply_one(p))
        for bug in known_fix_bugs(list(known_dirs)):
            if bug.fix_error is None:
                with contextlib.suppress(patching.FixNotApplicable):
                    stack.enter_context(patching.applied(bug.patches))
        try:
            return evaluate(scenario, "fixed", efficiency=False).verdict.clean
        except Exception:  # noqa: BLE001 - a replay that cannot run says nothing either way
            return None


def survivor_evidence(rows: list[dict], dirs: list[str]) -> Iterator[tuple[dict, dict]]:
    """(row, evidence) for each survivor in `rows`, from every case under `dirs` (seeds,
    regressions, other mutants' findings), milliseconds per case:
    - `kills`: a case that fails with the mutant and is clean without: the input model reaches
      it, so it is missed, not unreachable;
    - `efficiency`: a case clean with the mutant but worse in cache hits than unmutated vLLM
      (strict efficiency oracle, which campaigns do not run);
    - `differs`: how many cases schedule differently at all (trace digest): 0 of many is the
      first hint of an equivalent mutant, never the proof;
    - `raised`: how many cases the unmutated vLLM runs but that raise out of `evaluate` with the
      mutant (a tool failure: the harness met state it cannot judge), and the first one. Not 0 is a
      gap in mambafuzz to look at, not evidence that the mutant is harmless."""
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.store.corpus import load_case
    from mambafuzz.store.report import trace_digest

    cases = []
    for d in dirs:
        for path in sorted(Path(d).rglob("*.json")):
            try:
                cases.append((str(path), load_case(path).scenario))
            except Exception:  # noqa: BLE001 - not a case (a stats or analysis file): skipped
                continue
    base = {}
    for path, sc in cases:
        try:
            ev = evaluate(sc, "fixed", efficiency=False)
            base[path] = (ev.verdict.clean, trace_digest(ev.trace))
        except Exception:  # noqa: BLE001 - a case this vLLM rejects says nothing
            continue
    for r in rows:
        if r["status"] != "survived":
            continue
        e: dict = {"kills": None, "efficiency": None, "differs": 0, "cases": 0, "raised": 0, "raised_first": None}
        for path, sc in cases:
            if path not in base:
                continue
            try:
                ev = evaluate(sc, "fixed", efficiency=True, strict_efficiency=True, patches=planting.patches(r["id"]))
            except Exception as exc:  # noqa: BLE001 - counted: the run did not judge this case
                e["raised"] += 1
                e["raised_first"] = e["raised_first"] or f"{path} ({type(exc).__name__}: {str(exc)[:200]})"
                continue
            e["cases"] += 1
            e["differs"] += trace_digest(ev.trace) != base[path][1]
            if not ev.verdict.clean and base[path][0]:
                kind = ev.verdict.primary.signature
                if kind.startswith("efficiency"):
                    e["efficiency"] = e["efficiency"] or f"{path} ({kind})"
                else:
                    e["kills"] = e["kills"] or f"{path} ({kind})"
        yield r, e
