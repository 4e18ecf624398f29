"""What happens to a violation once an engine finds one: check it reproduces, decide whether
it is a known bug, minimize it, and write it (and the raw input) atomically.

A violation is a known bug only when a known bug's fix explains it (`mambafuzz.checks.attribution`); its
signature is just the fast first key. Within a campaign (and against the findings directory)
a signature already filed as new still counts as a duplicate: there is no fix to tell two
new root causes apart yet.

Every engine (random loop, atheris target, Hypothesis target) hands its findings here, so
they are all filed the same way.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mambafuzz.checks import attribution
from mambafuzz.checks.pipeline import fine_signature_of, signature_of
from mambafuzz.model.scenario import Scenario
from mambafuzz.search.minimizer import minimize
from mambafuzz.sim.vllm_compat.about import vllm_version
from mambafuzz.store.corpus import PRE_EXISTING, atomic_write, case_json, content_name, iter_cases

REPRO_RUNS = 3


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:120]


class KnownSignatures(set):
    """The known signatures, carrying the known bugs they came from (`bugs`), so a store built
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


STALE_TEMP_SECONDS = 300


def sweep_stale_temporaries(directory: Path) -> int:
    """Remove `.name.*.tmp` files a killed writer left behind.  Only old ones: a fresh one may
    belong to another live process about to rename it into place."""
    removed = 0
    now = time.time()
    for p in directory.rglob(".*.tmp"):
        try:
            if now - p.stat().st_mtime > STALE_TEMP_SECONDS:
                p.unlink()
                removed += 1
        except OSError:
            pass
    return removed


@dataclass(frozen=True)
class Judge:
    """How a store re-checks what it files and says how to replay it: the signature a scenario
    fails with (None: clean or unusable), the findings' file-name prefix, the replay command
    for a filed case, and entries added to its finding block.  The scheduler target judges by
    the oracles under a split (`oracle_judge`), the conform target by the conformance
    comparison (mambafuzz.conform.target)."""

    label: str
    signature_of: Callable[[Scenario], str | None]
    repro: Callable[[Path, str], str]  # (case path, signature) -> command
    meta: dict = field(default_factory=dict)
    fine_signature_of: Callable[[Scenario], str | None] | None = None  # None: the coarse one is as fine as it gets


def oracle_judge(split: str) -> Judge:
    return Judge(split, lambda s: signature_of(s, split), lambda path, sig: f"mambafuzz repro {path} --split {split}",
                 fine_signature_of=lambda s: fine_signature_of(s, split))


@dataclass
class Filed:
    signature: str
    path: Path
    flaky: bool
    repro_rate: str
    minimize_seconds: float
    size: tuple[int, int, int]
    pre_existing: bool = False  # PR mode: the base shows it too (recorded, not minimized, never new)


@dataclass
class FindingStore:
    findings_dir: Path
    split: str
    known: set[str] = field(default_factory=set)
    minimize_budget: float = 30.0
    repro_runs: int = REPRO_RUNS
    announce: bool = True
    filed: list[Filed] = field(default_factory=list)
    duplicates: int = 0
    # Known bugs to attribute by fix; None takes `known.bugs` when `known` came from
    # known_signatures(), and with neither the store falls back to signature matching.
    known_bugs: list[attribution.KnownBug] | None = None
    attributed: dict[str, int] = field(default_factory=dict)  # known bug -> instances seen
    judge: Judge | None = None  # None: the oracles under `split`
    # PR mode (mambafuzz.search.base_oracle): how a scenario fails on the PR's base vLLM. A violation
    # the base shows too is pre-existing: recorded under pre-existing/, labelled by the known
    # fixes, never filed as new; known fixes then label findings and drop none.
    base: Callable[[Scenario], str | None] | None = None
    base_label: str = ""
    pre_existing: list[Filed] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.findings_dir = Path(self.findings_dir)
        self.findings_dir.mkdir(parents=True, exist_ok=True)
        sweep_stale_temporaries(self.findings_dir)
        if self.judge is None:
            self.judge = oracle_judge(self.split)
        if self.known_bugs is None:
            self.known_bugs = getattr(self.known, "bugs", None)
        # Fine signatures filed as new, here or by an earlier run into the same directory (an
        # older finding without one counts by its coarse signature).
        self.new_signatures: set[str] = set()
        self.pre_existing_signatures: set[str] = set()
        for case in iter_cases([self.findings_dir], warn=lambda msg: None):
            meta = case.extra.get("finding")
            if isinstance(meta, dict) and meta.get("pre_existing") and meta.get("signature"):
                self.pre_existing_signatures.add(meta.get("fine_signature") or meta["signature"])
            elif isinstance(meta, dict) and meta.get("split") == self.split and meta.get("signature"):
                self.new_signatures.add(meta.get("fine_signature") or meta["signature"])
                if meta.get("fine_signature_found"):
                    self.new_signatures.add(meta["fine_signature_found"])

    def is_duplicate(self, scenario: Scenario, signature: str,
                     fine_signature: str | None = None) -> attribution.Attribution | None:
        """None when the violation is new; else why it is not (a known bug's fix explains it, or
        its fine signature, the coarse one plus the mechanism, was already filed as new)."""
        if (fine_signature or signature) in self.new_signatures:
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

    def handle(self, scenario: Scenario, signature: str, message: str, origin: dict,
               raw: bytes | None = None, fine_signature: str | None = None) -> Filed | None:
        """File a finding unless it is a known bug or a fine signature already filed; returns
        what was written. `signature` (coarse) is what replays, minimization and attribution
        match; `fine_signature` (default: the coarse one) only keys the within-campaign dedup."""
        self._closest = None
        fine = fine_signature or signature
        if self.base is not None:
            return self._handle_against_base(scenario, signature, message, origin, raw, fine)
        if self.is_duplicate(scenario, signature, fine) is not None:
            self.duplicates += 1
            return None
        closest = self._closest
        # A new bug that looks like a known one must not minimize into an instance of it.
        lookalikes = [closest.closest] if closest is not None and closest.closest is not None else []
        return self._file(scenario, signature, message, origin, raw, fine, lambda c: not self._explained(c, lookalikes),
                          {"attribution": closest.to_json()} if closest is not None else {},
                          closest.closest if closest is not None else None, closest.reason if closest else "")

    def _label(self, scenario: Scenario, signature: str) -> attribution.Attribution | None:
        """Which known fixes explain `scenario` (a label in PR mode, never a reason to drop it)."""
        return attribution.attribute(scenario, self.split, signature, self.known_bugs) if self.known_bugs else None

    def _handle_against_base(self, scenario: Scenario, signature: str, message: str, origin: dict,
                             raw: bytes | None, fine: str) -> Filed | None:
        """PR mode: a violation fails the PR only when the base does not show it; one the base
        shows too is recorded once per fine signature as pre-existing, with its known-fix label.
        The base is asked even when a pre-existing finding has the same fine signature: a new
        bug can poison a slot the way an old one does (the hash-grid split bug and the mid-block
        checkpoint bug)."""
        if fine in self.new_signatures:
            self.duplicates += 1
            return None
        on_base = self.base(scenario)
        base_meta = {"base": {"where": self.base_label, "signature": on_base}}
        if on_base == signature:
            if fine in self.pre_existing_signatures:
                self.duplicates += 1
                return None
            self.pre_existing_signatures.add(fine)
            label = self._label(scenario, signature)
            name = slug(f"{self.judge.label}-{fine}")
            path = self.findings_dir / PRE_EXISTING / f"{name}.json"
            meta = {"signature": signature, "fine_signature": fine, "kind": signature.split(":")[0],
                    "split": self.split, "message": message, "origin": origin, "pre_existing": True,
                    "vllm": vllm_version(), "repro": self.judge.repro(path, signature), **base_meta,
                    **({"attribution": label.to_json()} if label is not None else {})}
            atomic_write(path, case_json(scenario, finding=meta, note=f"pre-existing (the base shows it): {message}"))
            filed = Filed(signature, path, False, "1/1", 0.0, scenario.size(), pre_existing=True)
            self.pre_existing.append(filed)
            return filed
        label = self._label(scenario, signature)
        return self._file(scenario, signature, message, origin, raw, fine, lambda c: self.base(c) != signature,
                          {**base_meta, **({"attribution": label.to_json()} if label is not None else {})},
                          None, "")

    def _file(self, scenario: Scenario, signature: str, message: str, origin: dict, raw: bytes | None, fine: str,
              keeps: Callable[[Scenario], bool], extra: dict, lookalike: attribution.KnownBug | None,
              why_not: str) -> Filed:
        """Re-run, minimize (keeping the coarse signature and `keeps`) and write a new finding."""
        self.new_signatures.add(fine)
        judge = self.judge
        name = slug(f"{judge.label}-{fine}")
        if raw is not None:
            atomic_write(self.findings_dir / "raw" / f"{name}.{content_name(raw, '.bin')}", raw)
        decoded = scenario.dumps()
        atomic_write(self.findings_dir / "raw" / f"{name}.{content_name(decoded, '.decoded.json')}", decoded)
        hits = sum(judge.signature_of(scenario) == signature for _ in range(self.repro_runs))
        rate = f"{hits}/{self.repro_runs}"
        flaky = hits < self.repro_runs
        t0 = time.monotonic()
        if flaky:
            small, seconds = scenario, 0.0
        else:
            result = minimize(scenario, lambda c: judge.signature_of(c) == signature and keeps(c),
                              time_budget=self.minimize_budget)
            small, seconds = result.scenario, time.monotonic() - t0
        path = self.findings_dir / (f"flaky-{name}.json" if flaky else f"{name}.json")
        # Minimizing keeps the coarse signature; the mechanism may move, so the file says both.
        fine_small = fine if small is scenario or judge.fine_signature_of is None else (
            judge.fine_signature_of(small) or fine)
        meta = {
            "signature": signature, "fine_signature": fine_small, "fine_signature_found": fine,
            "kind": signature.split(":")[0], "split": self.split, "message": message,
            "origin": origin, "reproduced": rate, "flaky": flaky, "vllm": vllm_version(),
            "minimized": {"requests": small.size()[0], "last_step": small.size()[1], "tokens": small.size()[2],
                          "seconds": round(seconds, 2), "from_size": list(scenario.size())},
            "repro": judge.repro(path, signature), **judge.meta, **extra,
        }
        atomic_write(path, case_json(small, finding=meta, note=f"found by {origin.get('engine', '?')}: {message}"))
        filed = Filed(signature, path, flaky, rate, seconds, small.size())
        self.filed.append(filed)
        if self.announce:
            tag = "FLAKY" if flaky else "FOUND"
            like = f"; NOT the known {lookalike.name} ({why_not})" if lookalike is not None else ""
            print(f"{tag} {fine} reproduced {rate} -> {path} (minimized to {small.size()[0]} requests, "
                  f"{small.size()[2]} tokens in {seconds:.1f}s){like}", flush=True)
        return filed
