"""Triage: what happens to a violation once a judge finds one.  Decide whether it is new
(dedup, attribution to known bugs, or in PR mode the base's verdict), check it reproduces,
minimize it, write its finding block, hand it to the store, and announce it.

The stage is built from three parts and owns nothing else: a `Judge` (the signature functions
of the checks pipeline, or of the conform target: mambafuzz.checks.pipeline), a minimizer
(mambafuzz.search.minimizer.minimize) and a `FindingDatabase`, the narrow interface of the
findings directory (mambafuzz.store.finding_store.FindingStore), which only saves and lists.
In PR mode a fourth part, `PrMode` (mambafuzz.search.pr), decides each violation against the base.

A violation is a known bug only when a known bug's fix explains it (`mambafuzz.checks.attribution`);
its signature is just the fast first key. Within a campaign (and against the findings directory)
a fine signature already filed as new still counts as a duplicate: there is no fix to tell two
new root causes apart yet.

Every engine (random loop, atheris target, Hypothesis target) hands its violations here
(mambafuzz.search.target_runtime), so they are all filed the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from mambafuzz.checks import attribution
from mambafuzz.checks.pipeline import Judge, oracle_judge
from mambafuzz.findings import Violation
from mambafuzz.model.scenario import Scenario, engine_realism_notes
from mambafuzz.search.minimizer import MinimizeResult, minimize
from mambafuzz.sim.bridge.vllm_compat.about import vllm_version
from mambafuzz.store.finding_store import FiledSignatures

REPRO_RUNS = 3


class FindingDatabase(Protocol):
    """What triage needs of a findings store: which fine signatures are on file, where a
    finding will live (its repro command names the path), and saving findings and raw inputs."""

    def filed_signatures(self, split: str) -> FiledSignatures: ...

    def path_for(self, key: str, *, flaky: bool = False, pre_existing: bool = False) -> Path: ...

    def save(self, path: Path, scenario: Scenario, finding: dict, note: str) -> Path: ...

    def save_raw(self, key: str, data: str | bytes, suffix: str) -> Path: ...


Minimizer = Callable[..., MinimizeResult]  # (scenario, still_fails, time_budget=seconds) -> result


class PrMode(Protocol):
    """PR mode's judge of a violation against the base vLLM (mambafuzz.search.pr.AgainstBase):
    it files the violation through this stage as new (`file`), records it as pre-existing, or
    drops it as a duplicate."""

    def handle(self, stage: Triage, scenario: Scenario, violation: Violation, origin: dict,
               raw: bytes | None) -> Filed | None: ...


class KnownSignatures(set):
    """The known signatures, carrying the known bugs they came from (`bugs`), so triage built
    from them attributes by fix instead of matching signatures."""

    bugs: list[attribution.KnownBug]


def known_signatures(dirs: list[Path], split: str, runner: str | None = None) -> KnownSignatures:
    """The signatures of the known bugs under `dirs` for fuzzing `split` (recorded in a case's
    `finding` block, or obtained by replaying regression cases); `.bugs` holds the bugs.
    Signatures are only the fast first key: whether a finding is an instance of a known bug is
    decided by replaying it (which carries its model runner, `runner`) under the bug's fix."""
    known = KnownSignatures()
    known.bugs = attribution.known_bugs_for([d for d in dirs if d.exists()], split)
    for bug in known.bugs:
        known.update(bug.signatures)
    return known


@dataclass
class Filed:
    violation: Violation  # as judged when it was found (its `finding` event carries it)
    path: Path
    flaky: bool
    repro_rate: str
    minimize_seconds: float
    size: tuple[int, int, int]
    pre_existing: bool = False  # PR mode: the base shows it too (recorded, not minimized, never new)
    replaces: bool = False  # a larger gap than the case filed before under its fine signature, saved over it

    @property
    def signature(self) -> str:
        return self.violation.signature


@dataclass
class Triage:
    store: FindingDatabase
    split: str
    judge: Judge | None = None  # None: the oracles under `split`
    minimizer: Minimizer = minimize
    known: set[str] = field(default_factory=set)
    minimize_budget: float = 30.0
    repro_runs: int = REPRO_RUNS
    announce: bool = True
    # Known bugs to attribute by fix; None takes `known.bugs` when `known` came from
    # known_signatures(), and with neither triage falls back to signature matching.
    known_bugs: list[attribution.KnownBug] | None = None
    # PR mode (mambafuzz.search.pr): the base judges every violation, and files it through this stage
    # as new or records it as pre-existing; known fixes then label findings and drop none.
    base: PrMode | None = None
    filed: list[Filed] = field(default_factory=list)
    pre_existing: list[Filed] = field(default_factory=list)
    # fine signature -> the gap of the case filed under it (efficiency regressions; this campaign's only)
    largest_gap: dict[str, int] = field(default_factory=dict)
    regaps: dict[str, int] = field(default_factory=dict)  # fine signature -> cases saved over the first
    duplicates: int = 0
    attributed: dict[str, int] = field(default_factory=dict)  # known bug -> instances seen
    # candidate fixes of untriaged findings (known_bugs.untriaged_candidates): they label a finding
    # their fix explains ("untriaged candidate ..."), and never drop one
    untriaged: list[attribution.KnownBug] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.judge is None:
            self.judge = oracle_judge(self.split)
        if self.known_bugs is None:
            self.known_bugs = getattr(self.known, "bugs", None)
        # Fine signatures filed as new, here or by an earlier run into the same store.
        on_file = self.store.filed_signatures(self.split)
        self.new_signatures: set[str] = on_file.new
        self.pre_existing_signatures: set[str] = on_file.pre_existing
        self._closest: attribution.Attribution | None = None

    # ---- is it new? ------------------------------------------------------------------------
    def is_duplicate(self, scenario: Scenario, violation: Violation) -> attribution.Attribution | None:
        """None when the violation is new; else why it is not (a known bug's fix explains it, or
        its fine signature, the coarse one plus the mechanism, was already filed as new)."""
        signature = violation.signature
        if violation.fine in self.new_signatures:
            return attribution.Attribution((), None, "signature already filed as new")
        if self.known_bugs is None:
            if signature in self.known:
                return attribution.Attribution((), None, "known signature (no known bugs to attribute by fix)")
            return None
        att = attribution.attribute(scenario, self.split, signature, self.known_bugs)
        if not att.is_new:
            for b in att.known:
                self.attributed[b.name] = self.attributed.get(b.name, 0) + 1
            return att
        self._closest = att
        return None

    def _explained(self, scenario: Scenario, bugs: list[attribution.KnownBug]) -> bool:
        """Would a known fix explain `scenario`: one of `bugs` alone, or every known fix together
        (else minimizing can keep a second known bug that no single fix removes)."""
        if any(b.has_usable_fix and attribution.clean_under(scenario, self.split, (b,)) for b in bugs):
            return True
        together = [b for b in self.known_bugs or () if b.has_usable_fix]
        return len(together) > 1 and attribution.clean_under(scenario, self.split, together)

    def labels(self, saved: Scenario, signature: str, extra: dict) -> dict:
        """The finding block's labels for the case as saved: `extra`'s attribution (the known fixes
        that explain it) or, when none does, which untriaged candidate's fix removes it
        (`attribution.untriaged_explanation`); and whether a real engine builds its config
        (`engine_realism_notes`)."""
        notes = engine_realism_notes(saved.engine)
        labels = {**extra, "engine": {"real_engine_builds": not notes, "notes": notes}}
        att = labels.get("attribution")
        if (att is None or not att.get("known")) and self.untriaged:
            name = attribution.untriaged_explanation(saved, self.split, signature, self.untriaged, self.known_bugs or [])
            if name is not None:
                labels["attribution"] = {**(att or {"new": True, "known": [], "closest": None, "reason": ""}),
                                         "untriaged": name}
        return labels

    # ---- the stage -------------------------------------------------------------------------
    def handle(self, scenario: Scenario, violation: Violation, origin: dict, raw: bytes | None = None) -> Filed | None:
        """File a finding unless it is a known bug or a fine signature already filed; returns
        what was saved. The coarse signature is what replays, minimization and attribution
        match; the fine one (default: the coarse one) only keys the within-campaign dedup."""
        self._closest = None
        if self.base is not None:
            return self.base.handle(self, scenario, violation, origin, raw)
        if self.is_duplicate(scenario, violation) is not None:
            self.duplicates += 1
            return None
        closest = self._closest
        # A new bug that looks like a known one must not minimize into an instance of it.
        lookalikes = [closest.closest] if closest is not None and closest.closest is not None else []
        return self.file(scenario, violation, origin, raw, lambda c: not self._explained(c, lookalikes),
                         {"attribution": closest.to_json()} if closest is not None else {},
                         closest.closest if closest is not None else None, closest.reason if closest else "")

    def file(self, scenario: Scenario, violation: Violation, origin: dict, raw: bytes | None,
             keeps: Callable[[Scenario], bool], extra: dict, lookalike: attribution.KnownBug | None,
             why_not: str) -> Filed:
        """Re-run, minimize (keeping the coarse signature, at least the gap, and `keeps`) and save a
        new finding, or a larger gap over the case its fine signature filed before."""
        signature, fine, message, gap = violation.signature, violation.fine, violation.message, violation.gap
        replaces = fine in self.new_signatures
        self.new_signatures.add(fine)
        judge = self.judge
        key = f"{judge.label}-{fine}"
        if raw is not None:
            self.store.save_raw(key, raw, ".bin")
        self.store.save_raw(key, scenario.dumps(), ".decoded.json")
        hits = sum(judge.signature_of(scenario) == signature for _ in range(self.repro_runs))
        rate = f"{hits}/{self.repro_runs}"
        flaky = hits < self.repro_runs
        t0 = time.monotonic()
        if flaky:
            small, seconds = scenario, 0.0
        else:
            def still_fails(c: Scenario) -> bool:
                failure = judge.failure_of(c)
                return failure is not None and failure[0] == signature and failure[1] >= gap and keeps(c)

            result = self.minimizer(scenario, still_fails, time_budget=self.minimize_budget)
            small, seconds = result.scenario, time.monotonic() - t0
        path = self.store.path_for(key, flaky=flaky)
        # Minimizing keeps the coarse signature; the mechanism may move, so the file says both.
        fine_small = fine if small is scenario or not judge.fine else (judge.fine_signature_of(small) or fine)
        meta = {
            "signature": signature, "fine_signature": fine_small, "fine_signature_found": fine,
            "kind": violation.kind, "split": self.split, "message": message,
            "origin": origin, "reproduced": rate, "flaky": flaky, "vllm": vllm_version(),
            "minimized": {"requests": small.size()[0], "last_step": small.size()[1], "tokens": small.size()[2],
                          "seconds": round(seconds, 2), "from_size": list(scenario.size())},
            "repro": judge.repro(path, signature), **judge.meta, **self.labels(small, signature, extra),
        }
        if gap:
            failure = judge.failure_of(small) if small is not scenario else (signature, gap)
            meta["gap"] = self.largest_gap[fine] = failure[1] if failure is not None else gap
        self.store.save(path, small, meta, f"found by {origin.get('engine', '?')}: {message}")
        filed = Filed(violation, path, flaky, rate, seconds, small.size(), replaces=replaces)
        self.filed = [f for f in self.filed if f.violation.fine != fine] + [filed]
        if self.announce:
            tag = "FLAKY" if flaky else "LARGER GAP" if replaces else "FOUND"
            like = f"; NOT the known {lookalike.name} ({why_not})" if lookalike is not None else ""
            print(f"{tag} {fine} reproduced {rate} -> {path} (minimized to {small.size()[0]} requests, "
                  f"{small.size()[2]} tokens in {seconds:.1f}s){like}", flush=True)
        return filed
