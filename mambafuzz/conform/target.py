"""The conform fuzz target's verdict (`mambafuzz fuzz --target conform`): a scenario in, the
first row where the kernel model and vLLM's own worker code disagree out, named
`conform:<field>/<mixer>@<runner>`, where the field is the first of FIELDS that differs.

It is `mambafuzz conform`'s comparison (mambafuzz/conform/compare.py) stopped at its first
disagreement, so a filed case replays with `mambafuzz conform FILE --runner R`, and the
minimizer keeps a smaller scenario only while its first disagreement has the same signature.
"""

from __future__ import annotations

from collections.abc import Sequence

from mambafuzz.checks.pipeline import Judge
from mambafuzz.conform import compare as conform_check
from mambafuzz.conform import drive as conform_drive
from mambafuzz.conform import row_classes
from mambafuzz.exit_codes import ToolError, one_line
from mambafuzz.findings import Violation
from mambafuzz.model.scenario import Scenario, ScenarioError
from mambafuzz.sim.bridge import configs

FIELDS = ("read", "writes", "precopy", "postcopy", "checkpoint")  # conform_check.Effect, in order


def signature(d: conform_check.Disagreement) -> str:
    field = next(f for f, mine, theirs in zip(FIELDS, d.mirror, d.vllm, strict=True) if mine != theirs)
    return f"conform:{field}/{d.mixer}@{d.runner}"


def runner_of(sig: str) -> str:
    return sig.rpartition("@")[2]


def first_disagreement(s: Scenario, runners: Sequence[str],
                       coverage: row_classes.ClassCoverage | None = None) -> conform_check.Disagreement | None:
    """The first disagreeing row of `s` on `runners`, or None.  A config vLLM refuses is bad
    input (ScenarioError), as in the scheduler target; any other exception is the tier failing
    on this input (ToolError), never a disagreement.  `coverage` counts the row classes `s`
    reached on each runner (up to its first disagreement)."""
    observe = None
    if coverage is not None:
        spec = s.engine.num_speculative_tokens if s.engine.uses_spec_decode else 0
        tallies: dict[str, row_classes.ClassTally] = {}
        reached: dict[str, set[str]] = {}

        def observe(runner: str, step) -> None:
            tally = tallies.setdefault(runner, row_classes.ClassTally(spec))
            reached.setdefault(runner, set()).update(tally.feed(step))
    try:
        found = next(conform_check.compare(s, tuple(runners), observe), None)
        for runner, classes in (reached.items() if coverage is not None else ()):
            coverage.add(runner, classes)
        return found
    except configs.ConfigRejected as exc:
        raise ScenarioError([str(exc)]) from None
    except conform_drive.SchedulerRaised as exc:  # the scheduler target's input, not this tier's
        raise ScenarioError([str(exc)]) from None
    except (ScenarioError, ToolError):
        raise
    except Exception as exc:  # noqa: BLE001 - said in one line; the worker keeps the input
        raise ToolError(f"the conformance tier raised {one_line(exc, where=True)}; "
                        "a tool failure, not a disagreement") from exc


def verdict(s: Scenario, runners: Sequence[str], coverage: row_classes.ClassCoverage | None = None) -> Violation | None:
    """The first disagreement (its signature is as fine as it gets), or None when the mirror agrees."""
    d = first_disagreement(s, runners, coverage)
    return None if d is None else Violation(signature(d), d.describe())


def judge(runners: Sequence[str], patch_specs: Sequence[str] = (),
          coverage: row_classes.ClassCoverage | None = None) -> Judge:
    """How a worker judges, and triage re-checks, names and replays, conform findings (the
    `--patch` specs are part of the replay command: a planted rule lives in them)."""

    def repro(path, sig: str) -> str:
        return f"mambafuzz conform {path} --runner {runner_of(sig)}" + "".join(f" --patch {p}" for p in patch_specs)

    return Judge("conform", lambda s: verdict(s, runners, coverage), repro, {"target": "conform", "runners": list(runners)},
                 fine=False)
