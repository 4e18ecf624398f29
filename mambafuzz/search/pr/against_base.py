"""PR mode in triage: a violation fails the PR only when its base does not show it.

Triage (mambafuzz.search.triage) hands every violation of a PR-mode campaign to `AgainstBase.handle`,
which asks the base process (mambafuzz.search.pr.base_process) how the scenario fails there. One
the base shows too is recorded once per fine signature as pre-existing, with its known-fix label;
one it does not show is filed as new through the triage stage and minimized keeping "the base
does not show it". Known fixes only label findings here; they drop none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mambafuzz.checks import attribution
from mambafuzz.findings import Violation
from mambafuzz.model.scenario import Scenario
from mambafuzz.search.triage import Filed, Triage
from mambafuzz.sim.bridge.vllm_compat.about import vllm_version

MAX_REGAPS = 3  # larger gaps saved over a fine signature's first case, each minimized again


@dataclass
class AgainstBase:
    """The base's say in triage: `signature_on_base` tells how a scenario fails on the PR's base
    vLLM (None: clean), `where` names the base in each finding block."""

    signature_on_base: Callable[[Scenario], str | None]
    where: str = ""

    def handle(self, stage: Triage, scenario: Scenario, violation: Violation, origin: dict,
               raw: bytes | None) -> Filed | None:
        """A violation fails the PR only when the base does not show it; one the base shows too is
        recorded once per fine signature as pre-existing, with its known-fix label. The base is
        asked even when a pre-existing finding has the same fine signature: a new bug can poison a
        slot the way an old one does (the hash-grid split bug and the mid-block checkpoint bug)."""
        signature, fine = violation.signature, violation.fine
        if fine in stage.new_signatures:
            if not larger_gap(stage, violation):
                stage.duplicates += 1
                return None
            stage.regaps[fine] = stage.regaps.get(fine, 0) + 1
        on_base = self.signature_on_base(scenario)
        base_meta = {"base": {"where": self.where, "signature": on_base}}
        if on_base == signature:
            if fine in stage.pre_existing_signatures:
                stage.duplicates += 1
                return None
            stage.pre_existing_signatures.add(fine)
            label = known_fix_label(stage, scenario, signature)
            path = stage.store.path_for(f"{stage.judge.label}-{fine}", pre_existing=True)
            meta = {"signature": signature, "fine_signature": fine, "kind": violation.kind,
                    "split": stage.split, "message": violation.message, "origin": origin, "pre_existing": True,
                    "vllm": vllm_version(), "repro": stage.judge.repro(path, signature), **base_meta,
                    **stage.labels(scenario, signature, {"attribution": label.to_json()} if label is not None else {})}
            stage.store.save(path, scenario, meta, f"pre-existing (the base shows it): {violation.message}")
            filed = Filed(violation, path, False, "1/1", 0.0, scenario.size(), pre_existing=True)
            stage.pre_existing.append(filed)
            return filed
        label = known_fix_label(stage, scenario, signature)
        return stage.file(scenario, violation, origin, raw, lambda c: self.signature_on_base(c) != signature,
                          {**base_meta, **({"attribution": label.to_json()} if label is not None else {})}, None, "")


def larger_gap(stage: Triage, violation: Violation) -> bool:
    """Whether `violation` goes further past its base than the case filed under its fine
    signature (kept: the largest gap is the most telling case of a regression), at most
    MAX_REGAPS times a signature, since each one is minimized again."""
    filed = stage.largest_gap.get(violation.fine)
    return filed is not None and violation.gap > filed and stage.regaps.get(violation.fine, 0) < MAX_REGAPS


def known_fix_label(stage: Triage, scenario: Scenario, signature: str) -> attribution.Attribution | None:
    """Which known fixes explain `scenario` (a label in PR mode, never a reason to drop it)."""
    return attribution.attribute(scenario, stage.split, signature, stage.known_bugs) if stage.known_bugs else None
