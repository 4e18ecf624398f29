"""PR mode: a candidate vLLM (a pull request's) judged against its base vLLM.

A finding fails a PR only when the base does not show it. The modules here own every part of
that judgement:
- `base_process`: the base vLLM's own process (a PR's vLLM and its base cannot share one) and
  the one-line JSON protocol it answers;
- `against_base`: triage's rule: new when the base does not show it, else pre-existing;
- `efficiency_gate`: an input the PR's vLLM runs with more work than its base is a finding;
- `divergence`: where the two runs of one case first part (a finding's divergence key);
- `grouping`: a campaign's findings grouped by shared symptom and, with a base, divergence key;
- `changes`: how many changes separate the PR's vLLM from its base (one change, one root
  cause) and how the PR job splits its time between the targets (`python -m
  mambafuzz.search.pr.changes split BASE SECONDS`).

Triage, the fuzz targets and the CLI use only the functions below. Importing the package imports
no vLLM and starts nothing (the CI report reads the groups through it); each function imports
what it needs, and `base_process` and `changes`, which also run as `python -m` entry points, are
not imported on load.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mambafuzz.search.pr.grouping import GROUPS_FILE
from mambafuzz.search.pr.grouping import read as read_groups

if TYPE_CHECKING:
    from mambafuzz.findings import Violation
    from mambafuzz.search.pr.base_process import BaseProcess
    from mambafuzz.search.triage import Triage
    from mambafuzz.sim.trace import Trace

__all__ = ["GROUPS_FILE", "check_where", "compare_figures", "group_findings", "judge_against_base", "read_groups",
           "start_base"]


def check_where(where: str) -> str:
    """`--base WHERE` as the base process will use it: `installed` or a directory holding `vllm/`
    (made by ci/pr-overlay); a one-line UsageError otherwise."""
    from mambafuzz.search.pr.base_process import check_where

    return check_where(where)


def judge_against_base(triage: Triage, where: str, known_fix_dirs: list[str], *,
                       conform_runners: list[str] | None = None, efficiency_allowed: list[str] | None = None) -> None:
    """Put a worker's triage stage in PR mode, once: start the base process (`where`, under the
    stage's split and the campaign's known fixes) and judge each violation against it. With
    `conform_runners` the base judges as the conform target does on those runners; with
    `efficiency_allowed` (the scheduler target; None: no gate) every input also runs on the base
    and more work than the base's is a finding, except on the figures it allows."""
    from mambafuzz.search.pr.against_base import AgainstBase
    from mambafuzz.search.pr.base_process import BaseProcess

    base = BaseProcess(where, triage.split, known_fix_dirs, conform_runners=conform_runners)
    triage.base = AgainstBase(base.signature_of, where)
    if efficiency_allowed is not None:
        from mambafuzz.search.pr.efficiency_gate import check_allowed, gated_judge

        triage.judge = gated_judge(triage.split, base, check_allowed(efficiency_allowed))


def start_base(where: str, split: str) -> BaseProcess:
    """The base process for `mambafuzz repro --base` (its `figures_begin`/`figures_end`, `close`)."""
    from mambafuzz.search.pr.base_process import BaseProcess

    return BaseProcess(where, split)


def compare_figures(trace: Trace, theirs: dict[str, int] | None) -> tuple[dict[str, int], Violation | None]:
    """One run's resource figures and its efficiency regression against the base's figures
    `theirs` (None when nothing is worse, or the base could not run the case)."""
    from mambafuzz.search.pr import efficiency_gate

    ours = efficiency_gate.figures(trace)
    return ours, None if theirs is None else efficiency_gate.regression(ours, theirs)


def group_findings(paths: list[Path], split: str, findings: Path, patch_specs: list[str],
                   known_fix_dirs: list[str], replay: bool = True, base: str | None = None) -> list[dict]:
    """Group a campaign's new findings by shared symptom, replaying (unless not `replay`: after
    Ctrl-C) under what its workers ran (the vLLM here, its --patch specs and known fixes), and
    write FINDINGS/root-causes.jsonl. With a `base` (the PR job), links are gated by each finding's
    divergence key: its minimized case run here and on the base (`grouping`); and when the PR is
    one change away from its base, all its new findings are one group (`changes`)."""
    from mambafuzz.checks.pipeline import signature_of
    from mambafuzz.search.pr import grouping
    from mambafuzz.sim import patching
    from mambafuzz.store.known_bugs import known_fix_bugs

    patches = [p for spec in patch_specs for p in patching.load_patches(spec)]
    patches += [p for b in known_fix_bugs([Path(d) for d in known_fix_dirs]) if b.fix_error is None for p in b.patches]
    found = grouping.members([p for p in paths if p.exists()])
    divergence = None
    if base is not None and replay and found:
        from mambafuzz.search.pr.base_process import BaseProcess, divergence_keys

        process = BaseProcess(base, split, known_fix_dirs)
        try:
            keys = divergence_keys(found, split, patches, process)
        finally:
            process.close()
        divergence = lambda m: keys.get(m.path)  # noqa: E731
    groups = grouping.group(found, (lambda scenario, split: signature_of(scenario, split, patches)) if replay else None,
                            divergence)
    if divergence is not None and len(groups) > 1:
        from mambafuzz.search.pr import changes

        if changes.changes_against(base) == 1:  # every new finding needs the PR's one change
            groups = changes.one_group(groups)
    grouping.write(findings, groups)
    return groups
