"""The PR job's efficiency gate: an input on which the PR's vLLM serves fewer prefix-hit tokens,
runs more forward steps, or holds more blocks at its peak than its base is a finding,
`efficiency_regression`, with both sides' figures.

Prefix caching exists to save compute, and a change that keeps every state right can still
waste it (a checkpoint dropped early, a block freed late, an extra block taken). The figures of
one run are exact (the harness is deterministic), so the base process (mambafuzz.search.pr.base_process)
runs the same scenario beside this one, while it runs, and the two are compared figure by figure.
A figure a PR is meant to change is allowed in the job's arguments (`--allow-efficiency`),
never silenced here.
"""

from __future__ import annotations

from collections.abc import Iterable

from mambafuzz.checks.pipeline import Judge, evaluate
from mambafuzz.findings import Violation
from mambafuzz.model.scenario import Scenario
from mambafuzz.sim.trace import Trace

KIND = "efficiency_regression"
# figure -> (what it counts, True when more is worse)
FIGURES: dict[str, tuple[str, bool]] = {
    "hits": ("prefix-hit tokens served", False),
    "steps": ("forward steps", True),
    "blocks": ("peak blocks in use", True),
}


def figures(trace: Trace) -> dict[str, int]:
    """One cached run's resource figures (`Trace.resource_figures`, which the base answers too)."""
    return trace.resource_figures()


def figures_of(scenario: Scenario, split: str) -> dict[str, int]:
    """`scenario`'s figures under `split` in this process's vLLM: what the base answers."""
    from mambafuzz.search.pr.base_process import cached_run

    return figures(cached_run(scenario, split))


def check_allowed(names: Iterable[str]) -> frozenset[str]:
    """`--allow-efficiency` values; a ValueError naming an unknown figure."""
    allowed = frozenset(names)
    unknown = sorted(allowed - set(FIGURES))
    if unknown:
        raise ValueError(f"unknown efficiency figure(s) {', '.join(unknown)} (known: {', '.join(FIGURES)})")
    return allowed


def regression(ours: dict[str, int], theirs: dict[str, int], allowed: frozenset[str] = frozenset()) -> Violation | None:
    """The figures on which the PR's run (`ours`) is worse than the base's (`theirs`), as one
    violation whose location names them in a fixed order (`hits+blocks`); None when none is,
    or each one that is was allowed."""
    worse = [name for name, (_, more_is_worse) in FIGURES.items()
             if name not in allowed and (ours[name] > theirs[name] if more_is_worse else ours[name] < theirs[name])]
    if not worse:
        return None
    side_by_side = "; ".join(f"{FIGURES[n][0]} {ours[n]} here vs {theirs[n]} on the base" for n in worse)
    location = "+".join(worse)
    return Violation(f"{KIND}:{location}", f"the PR's vLLM does more work than its base: {side_by_side}",
                     gap=sum(abs(ours[n] - theirs[n]) for n in worse))


def gated_judge(split: str, base, allowed: frozenset[str] = frozenset()) -> Judge:
    """The oracles under `split`, then, for an input they pass, the efficiency gate against
    `base` (a BaseProcess): the base runs the scenario while this process does."""
    def verdict(scenario: Scenario) -> Violation | None:
        base.figures_begin(scenario)
        try:
            evaluation = evaluate(scenario, split, efficiency=False)
        finally:
            theirs = base.figures_end()
        found = evaluation.verdict.violation
        if found is not None or theirs is None:
            return found
        return regression(figures(evaluation.trace), theirs, allowed)

    return Judge(split, verdict, lambda path, sig: f"mambafuzz repro {path} --split {split}"
                 + (f" --base {base.where}" if sig.startswith(KIND) else ""))


# ---- confirming a mutant's kill (bench/mutation_run.py, bench/mutation_score.py) ----------------------
def confirms_regression(scenario: Scenario, mutant: str, signature: str) -> tuple[bool, str]:
    """A gate finding kills the mutant `mutant` (generated or planted;
    mambafuzz.tools.mutation.planting) when the mutant's figures are worse than the unmutated vLLM's
    on the case in exactly the figures `signature` names, both replayed here. The oracles' replay
    (`kills.confirms_kill`) cannot see a gate finding: its figures need a base."""
    from mambafuzz.sim import patching
    from mambafuzz.tools.mutation import planting

    theirs = figures_of(scenario, "fixed")
    with patching.applied(planting.patches(mutant)):
        ours = figures_of(scenario, "fixed")
    gap = regression(ours, theirs)
    if gap is not None and gap.signature == signature:
        return True, gap.message
    return False, f"replayed: {gap.signature if gap else 'no regression'} (filed {signature})"


def confirms_finding(scenario: Scenario, mutant: str, signature: str) -> tuple[bool, str]:
    """Whether a `--split fixed` campaign's finding (PR mode or not) kills the mutant: a gate finding
    on its figures (`confirms_regression`), any other by the oracles' replay (`kills.confirms_kill`)."""
    from mambafuzz.tools.mutation import kills

    if signature.startswith(f"{KIND}:"):
        return confirms_regression(scenario, mutant, signature)
    return kills.confirms_kill(scenario, "fixed", mutant, signature)
