"""Is a failing scenario an instance of a known bug? Only if the known bug's fix explains it:
the scenario fails as it is (the caller saw that) and replays clean with that fix applied.
Anything else is new, whatever its signature; the known bug with the same signature is still
named (`closest`) so a message can say what it looked like.

Signatures are the fast first key: known bugs with the finding's signature are tried first,
then the others of the same kind, then every known fix together, cut down to the ones the
scenario needs (a scenario can show two known bugs at once, of different kinds). A known bug whose fix no longer applies to the installed vLLM falls back
to replay of its own cases: if they still fail with the finding's signature the finding is
counted as that bug (and the reason says the fix could not be checked), else it is new.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from mambafuzz.store.known_bugs import KnownBug, apply_known_fixes, load_known_bugs

__all__ = ["Attribution", "KnownBug", "apply_known_fixes", "attribute", "load_known_bugs", "known_bugs_for"]


@dataclass(frozen=True)
class Attribution:
    known: tuple[KnownBug, ...]  # empty: a new bug
    closest: KnownBug | None  # a known bug with the same signature, for messages
    reason: str

    @property
    def is_new(self) -> bool:
        return not self.known

    def to_json(self) -> dict:
        return {"new": self.is_new, "known": [b.name for b in self.known],
                "closest": self.closest.name if self.closest else None, "reason": self.reason}


def _signature_of(scenario, split: str) -> str | None:
    from mambafuzz.checks.pipeline import signature_of

    return signature_of(scenario, split)


def known_bugs_for(dirs: list[Path], split: str) -> list[KnownBug]:
    """The known bugs under `dirs` for fuzzing `split` (regression signatures by replay)."""
    return load_known_bugs(dirs, split, signature_of=_signature_of)


def clean_under(scenario, split: str, bugs: tuple[KnownBug, ...] | list[KnownBug]) -> bool:
    """Does `scenario` replay clean with these bugs' fixes (patches, or their split) applied?

    A fix may change what vLLM's start-up check asks (finding 6's reserves more mamba blocks).
    When the fixed check asks more than the scenario's pool, an engine with the fix would not
    start on that pool, so the replay is judged on the smallest pool the fixed engine accepts."""
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.model.scenario import ScenarioError

    fix_split = next((b.fix_split for b in bugs if b.fix_split), split)
    patches = [p for b in bugs for p in b.patches]
    try:
        ev = evaluate(scenario, fix_split, efficiency=False, patches=patches)
        if ev.verdict.clean:
            return True
        floor = pool_floor_raised_by_fix(scenario, ev.trace)
        if floor is None:
            return False
        raised = dataclasses.replace(scenario, engine=dataclasses.replace(scenario.engine, num_gpu_blocks=floor))
        return evaluate(raised, fix_split, efficiency=False, patches=patches).verdict.clean
    except ScenarioError:
        return False


def pool_floor_raised_by_fix(scenario, fixed_trace) -> int | None:
    """The start-up minimum of the fixed vLLM (`fixed_trace`, a replay under the fix) when it is
    above the scenario's own pool, else None. Unpatched, a scenario's pool is never below vLLM's
    minimum (the validator's `min_pool_blocks`), so only a fix that raises the check gives one."""
    pool, floor = scenario.engine.num_gpu_blocks, fixed_trace.startup_min_blocks
    if pool is None or floor is None or floor <= pool:
        return None
    return floor


def untriaged_explanation(scenario, split: str, signature: str, candidates: list[KnownBug],
                          known: list[KnownBug] = ()) -> str | None:
    """The name of the first untriaged candidate (`known_bugs.untriaged_candidates`) whose fix,
    with every usable known fix beside it, removes the finding: `scenario` replays without any
    finding of `signature`. Not "clean": a case often shows a known bug beside the candidate's
    (the known fixes take those away), and a candidate fix may leave a resource finding of its
    own (one that drops a prefix hit is a `missed_hit`). None when no candidate does. A label
    for a finding, never a reason to drop it."""
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.model.scenario import ScenarioError

    beside = [p for b in known if b.fix_error is None for p in b.patches]
    for c in candidates:
        if not c.has_usable_fix:
            continue
        try:
            verdict = evaluate(scenario, split, efficiency=False, patches=[*c.patches, *beside]).verdict
        except ScenarioError:
            continue
        if all(f.signature != signature for f in verdict.findings):
            return c.name
    return None


def still_present(bug: KnownBug) -> bool:
    """Do the bug's own cases still fail with their recorded signature on the installed vLLM?"""
    return any(_signature_of(c.scenario, "fixed") in bug.signatures for c in bug.cases)


def minimal_explanation(scenario, split: str, bugs: list[KnownBug]) -> list[KnownBug]:
    """The fixes of `bugs` (which together make `scenario` replay clean) that it still needs:
    each is dropped in turn and stays dropped while the rest keep the replay clean."""
    needed = list(bugs)
    for b in bugs:
        rest = [x for x in needed if x is not b]
        if rest and clean_under(scenario, split, rest):
            needed = rest
    return needed


def attribute(scenario, split: str, signature: str, bugs: list[KnownBug]) -> Attribution:
    """Attribute a scenario that fails under `split` with `signature` (precondition) to the
    known bugs whose fixes explain it, or call it new."""
    kind = signature.split(":")[0]
    same = [b for b in bugs if signature in b.signatures]
    closest = same[0] if same else None
    tried = same + [b for b in bugs if b not in same and kind in b.kinds]
    usable = [b for b in tried if b.has_usable_fix]
    for b in usable:
        if clean_under(scenario, split, (b,)):
            return Attribution((b,), closest, f"replays clean with the fix of {b.name}")
    together = [b for b in bugs if b.has_usable_fix]  # a second known bug may be of another kind
    if len(together) > 1 and clean_under(scenario, split, together):
        needed = minimal_explanation(scenario, split, together)
        names = " + ".join(b.name for b in needed)
        return Attribution(tuple(needed), closest, f"replays clean only with the fixes of {names} together")
    for b in same:
        if b.fix_error is not None and still_present(b):
            return Attribution((b,), closest, f"the fix of {b.name} no longer applies ({b.fix_error}); its cases "
                                              "still fail with this signature, so it is counted by signature")
    if closest is not None:
        return Attribution((), closest, f"same signature as {closest.name}, but its fix does not explain it")
    return Attribution((), None, "no known fix explains it")
