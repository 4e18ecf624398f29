"""Every seed is clean on the installed split; every regression case gives its expected
verdict on each split it lists (`ci/regress` runs exactly this file). A case's
`expected_by_vllm` entry for the installed vLLM replaces its `expected` verdicts (mambafuzz/store/corpus.py);
a case the installed vLLM cannot run (a feature it lacks) is skipped with the reason."""

import json
from pathlib import Path

import pytest

from mambafuzz.checks.pipeline import evaluate as _evaluate
from mambafuzz.findings import export_assertion
from mambafuzz.model.scenario import ScenarioError
from mambafuzz.sim.bridge.vllm_compat import VllmUnsupported
from mambafuzz.store.corpus import load_case, split_key
from tests.helpers.known import unexplained

ROOT = Path(__file__).resolve().parents[2]
REGRESSION_DIR = Path(__import__("os").environ.get("MAMBAFUZZ_REGRESSIONS", ROOT / "corpus" / "regressions"))
SEEDS = sorted((ROOT / "corpus" / "seeds").glob("*.json"))
UPSTREAM = sorted((ROOT / "corpus" / "upstream").rglob("*.json"))  # corpus/upstream/<finding>/*.json
# (file, expected-table key): a key is a split (every model runner: both are replayed) or split@runner
REGRESSIONS = [(p, key) for p in sorted(REGRESSION_DIR.glob("*.json")) for key in load_case(p).expected]
RUNNERS = ("v1", "v2")


def _runs(key: str) -> list[tuple[str, str]]:
    """(split, runner) pairs an expected-table key stands for."""
    split, runner = split_key(key)
    return [(split, r) for r in ((runner,) if runner else RUNNERS)]


@pytest.mark.parametrize("path", SEEDS, ids=[p.stem for p in SEEDS])
def test_seed_is_clean_on_fixed(path):
    """Clean, apart from a triaged upstream behaviour its candidate fix removes (tests/helpers/known.py)."""
    left = unexplained(load_case(path).scenario, "fixed")
    assert left is None, left


@pytest.mark.parametrize("path, key", REGRESSIONS, ids=[f"{p.stem}[{k}]" for p, k in REGRESSIONS])
def test_regression_case_gives_its_expected_verdict(path, key):
    case = load_case(path)
    for split, runner in _runs(key):
        v = evaluate(case.scenario, split, efficiency=False, runner=runner).verdict
        detail = v.primary.message if v.primary else "no finding"
        assert v.kind == case.expected[key], (f"{path.name} under {split} on runner {runner}: expected "
                                              f"{case.expected[key]}, got {v.kind}: {detail}")


@pytest.mark.parametrize("path", UPSTREAM, ids=[p.stem for p in UPSTREAM])
def test_upstream_case_still_shows_its_behaviour(path):
    case = load_case(path)
    for key, kind in case.expected.items():
        for split, runner in _runs(key):
            got = evaluate(case.scenario, split, efficiency=False, runner=runner).verdict.kind
            assert got == kind, f"{path.name} under {split} on runner {runner}: expected {kind}, got {got}"


def evaluate(scenario, split, **kwargs):
    """The pipeline's evaluate, skipping what this vLLM cannot run (a missing feature, not a verdict)."""
    try:
        return _evaluate(scenario, split, **kwargs)
    except ScenarioError as exc:
        if any(p.startswith("cannot run") for p in exc.problems):
            pytest.skip("; ".join(exc.problems))
        raise
    except VllmUnsupported as exc:
        pytest.skip(str(exc))


UPSTREAM_FIXED = [p for p in UPSTREAM if (p.parent / "fix.py").is_file()]


def test_every_upstream_finding_has_a_fix_an_exported_test_and_a_report():
    """Issue 14's done-when: a candidate fix, an exported test per case and the issue text."""
    for finding in sorted({p.parent for p in UPSTREAM}):
        assert (finding / "fix.py").is_file(), f"{finding.name}: no candidate fix"
        assert (finding / "ISSUE.md").is_file(), f"{finding.name}: no exported report (mambafuzz export-report)"
        for case in finding.glob("*.json"):
            data = json.loads(case.read_text())
            async_only = data["engine"].get("async_scheduling", False) is not False
            unexportable = export_assertion(data.get("finding", {}).get("signature", "")) is None
            # an async-only case, or one whose kind has no exported assertion yet, has no standalone export
            # (tests/upstream/test_export.py checks the one-line refusal)
            assert async_only or unexportable or (finding / f"test_{case.stem}.py").is_file(), \
                f"{case.name}: no exported test"


@pytest.mark.parametrize("path", UPSTREAM_FIXED, ids=[p.stem for p in UPSTREAM_FIXED])
def test_upstream_case_is_clean_under_its_candidate_fix(path):
    from mambafuzz.sim import patching

    patches = patching.load_patches(str(path.parent / "fix.py"))
    assert patching.check_applies(patches) is None
    case = load_case(path)
    runners = sorted({r for key in case.expected for _, r in _runs(key)}) or [None]
    for runner in runners:  # a runner's worker bug shows on that runner only
        v = evaluate(case.scenario, "fixed", efficiency=False, patches=patches, runner=runner).verdict
        assert v.clean, f"runner {runner}: {v.primary.message}"


def test_corpus_is_not_empty():
    assert SEEDS and REGRESSIONS and UPSTREAM
