"""One evaluation: scenario -> traces (cached, uncached, reference split) -> verdict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mambafuzz.checks import oracle
from mambafuzz.model.scenario import Scenario, ScenarioError, with_runner
from mambafuzz.sim import harness, patching, splits
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


def _primary(scenario: Scenario, split: str, patches: Sequence[patching.Patch]):
    """The primary finding when `scenario` fails under `split` (and `patches`), else None; a
    scenario that cannot run is None too."""
    try:
        v = evaluate(scenario, split, efficiency=False, patches=patches).verdict
    except ScenarioError:
        return None
    return None if v.clean else v.primary


def signature_of(scenario: Scenario, split: str = "fixed", patches: Sequence[patching.Patch] = ()) -> str | None:
    """The primary finding's signature, or None.  The one definition of "fails the same way"
    (with `same_signature`) that filing, minimizing, attribution and export share."""
    primary = _primary(scenario, split, patches)
    return None if primary is None else primary.signature


def fine_signature_of(scenario: Scenario, split: str = "fixed", patches: Sequence[patching.Patch] = ()) -> str | None:
    """The primary finding's fine signature (the coarse one plus its mechanism), or None."""
    primary = _primary(scenario, split, patches)
    return None if primary is None else primary.fine_signature


def same_signature(scenario: Scenario, split: str, signature: str, patches: Sequence[patching.Patch] = ()) -> bool:
    """Does `scenario` still fail under `split` with exactly `signature`?"""
    return signature_of(scenario, split, patches) == signature
