"""One evaluation: scenario -> traces (cached, uncached, reference split) -> verdict; and the
`Judge` triage re-checks findings with (the oracles under a split: `oracle_judge`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mambafuzz.checks import oracle
from mambafuzz.findings import Violation
from mambafuzz.model.scenario import Scenario, ScenarioError, with_runner
from mambafuzz.sim import patching
from mambafuzz.sim.engine import harness, splits
from mambafuzz.sim.trace import Trace


@dataclass
class Evaluation:
    verdict: oracle.Verdict
    trace: Trace
    uncached: Trace | None
    reference: Trace | None


def evaluate(scenario: Scenario, split: str = "fixed", differential: bool = True,
             efficiency: bool = True, strict_efficiency: bool = False,
             patches: Sequence[patching.Patch] = (), runner: str | None = None) -> Evaluation:
    """Run `scenario` under `split` and judge it.  `differential` adds the prefix-caching-off
    run (same model runner, mamba_cache_mode "none"); `efficiency` adds a run of the installed
    split as the reference (skipped for fixed).  `patches` (candidate fixes) are applied to vLLM
    for the split's runs and restored after; the reference runs the installed vLLM as it is.
    `runner` overrides the scenario's model runner."""
    scenario = with_runner(scenario, runner)
    fn = splits.resolve(split)
    label = f"{split}+{len(patches)} patch(es)" if patches else split
    with patching.applied(patches):
        trace = harness.run(scenario, fn, label)
        uncached = harness.run(scenario, fn, label, prefix_caching=False) if differential else None
    reference = None
    if efficiency and (split != "fixed" or patches):
        reference = harness.run(scenario, None, "fixed")
    verdict = oracle.judge(trace, uncached, reference, strict_efficiency=strict_efficiency)
    return Evaluation(verdict, trace, uncached, reference)


def violation_of(scenario: Scenario, split: str = "fixed", patches: Sequence[patching.Patch] = ()) -> Violation | None:
    """The primary finding as a judge reports it when `scenario` fails under `split` (and
    `patches`), else None; ScenarioError when it cannot run."""
    return evaluate(scenario, split, efficiency=False, patches=patches).verdict.violation


def signature_of(scenario: Scenario, split: str = "fixed", patches: Sequence[patching.Patch] = ()) -> str | None:
    """The primary finding's signature, or None (a scenario that cannot run is None too).  The
    one definition of "fails the same way" (with `same_signature`) that filing, minimizing,
    attribution and export share."""
    try:
        v = violation_of(scenario, split, patches)
    except ScenarioError:
        return None
    return None if v is None else v.signature


def same_signature(scenario: Scenario, split: str, signature: str, patches: Sequence[patching.Patch] = ()) -> bool:
    """Does `scenario` still fail under `split` with exactly `signature`?"""
    return signature_of(scenario, split, patches) == signature


@dataclass(frozen=True)
class Judge:
    """What judges an input for a campaign, and how its findings are named and replayed: the
    violation a scenario fails with (`verdict`: None when clean; raises ScenarioError for a
    scenario that cannot run), the findings' file-name prefix, the replay command for a filed
    case, and entries added to its finding block.  The scheduler target judges by the oracles
    under a split (`oracle_judge`), the conform target by the conformance comparison
    (mambafuzz.conform.target).  A worker judges each input with it, and triage re-checks with
    it what it files (mambafuzz.search.triage)."""

    label: str
    verdict: Callable[[Scenario], Violation | None]
    repro: Callable[[Path, str], str]  # (case path, signature) -> command
    meta: dict = field(default_factory=dict)
    fine: bool = True  # its violations carry a fine signature (False: the coarse one is as fine as it gets)

    def _violation(self, scenario: Scenario) -> Violation | None:
        try:
            return self.verdict(scenario)
        except ScenarioError:
            return None

    def signature_of(self, scenario: Scenario) -> str | None:
        """The coarse signature `scenario` fails with; None when clean or unusable."""
        v = self._violation(scenario)
        return None if v is None else v.signature

    def fine_signature_of(self, scenario: Scenario) -> str | None:
        v = self._violation(scenario)
        return None if v is None else v.fine_signature

    def failure_of(self, scenario: Scenario) -> tuple[str, int] | None:
        """(coarse signature, gap) `scenario` fails with; None when clean or unusable."""
        v = self._violation(scenario)
        return None if v is None else (v.signature, v.gap)


def oracle_judge(split: str) -> Judge:
    return Judge(split, lambda s: violation_of(s, split), lambda path, sig: f"mambafuzz repro {path} --split {split}")
