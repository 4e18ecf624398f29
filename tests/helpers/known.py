"""Judging a case "clean apart from triaged upstream behaviour": a test that wants unmodified
vLLM clean on its input accepts a finding only when it is one of corpus/upstream's triaged
behaviours (by signature) and that behaviour's candidate fix removes it, so everything else
still fails the test."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from mambafuzz.checks.pipeline import evaluate
from mambafuzz.search.triage import known_signatures

UPSTREAM = Path(__file__).resolve().parents[2] / "corpus" / "upstream"


@cache
def _known():
    return known_signatures([UPSTREAM], "fixed")


def unexplained(scenario, split: str = "fixed", **evaluate_kw) -> str | None:
    """None when `scenario` is clean under `split`, or fails only with triaged upstream behaviours
    that their candidate fixes remove (one behaviour's fix may uncover another's finding: each
    primary finding left adds its behaviour's fix, until the verdict is clean or a finding is
    no triaged behaviour's); else the message of the finding left."""
    bugs: list = []
    verdict = evaluate(scenario, split, **evaluate_kw).verdict
    while not verdict.clean:
        more = [b for b in _known().bugs if verdict.primary.signature in b.signatures and b not in bugs]
        if not more:
            break
        bugs += more
        verdict = evaluate(scenario, split, patches=[p for b in bugs for p in b.patches], **evaluate_kw).verdict
    if verdict.clean:
        return None
    return verdict.primary.message + (f" (left by the fix of {', '.join(b.name for b in bugs)})" if bugs else "")
