"""Fewer reports for one cause: group findings that share a symptom and, in the PR job, a divergence.

A campaign deduplicates by fine signature, so one planted bug can file many findings (28 for
the pre-fix split), each a distinct symptom. Two cheap rules link findings by symptom:
- `mechanism`: the same coarse signature and the same mechanism of the minimized case (a
  finding's `fine_signature` is its minimized case's);
- `replay`: one finding's minimized case, replayed under the other's engine config, shows the
  other's signature (either way round): the first case's requests reach the second symptom.
Symptoms are shared by different bugs, so these rules alone join findings of two planted bugs in
one findings directory (bench/RESULTS.md). Where the campaign has a base (the PR job), each
finding also carries a divergence key (mambafuzz.search.pr.divergence: the output its minimized case
first shows differently on the PR's vLLM than on the base's), which depends on the code change,
not on the symptom. Then two findings join only when their keys agree AND a symptom rule links
them; a finding joins every group holding a member it is so linked to (merging those groups),
so the order findings came in does not matter. Without a base (plain `mambafuzz fuzz`) there is
no key, and a finding joins the first group whose first member a symptom rule links it to.
A group is a reading aid, never a verdict: every member is filed and fails a PR on its own.

Groups are written to FINDINGS/root-causes.jsonl (one group a line; not `*.json`, which names
scenario files) by the campaign, which replays under the campaign's own vLLM and patches, so the
CI report can show them without replaying anything.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mambafuzz.exit_codes import ToolError
from mambafuzz.model.scenario import Scenario
from mambafuzz.store.corpus import atomic_write, iter_cases

GROUPS_FILE = "root-causes.jsonl"
Replay = Callable[[Scenario, str], "str | None"]  # (scenario, split) -> its coarse signature, None: clean


@dataclass(frozen=True)
class Member:
    path: Path
    signature: str
    fine_signature: str
    split: str
    scenario: Scenario


def members(paths: list[Path]) -> list[Member]:
    """The findings in `paths` (files or directories, not their pre-existing/ or raw/ folders)
    that carry a finding block."""
    out = []
    for case in iter_cases(paths, warn=lambda msg: None):
        meta = case.extra.get("finding")
        if not isinstance(meta, dict) or not meta.get("signature") or meta.get("pre_existing") or meta.get("flaky"):
            continue
        out.append(Member(Path(case.path), meta["signature"], meta.get("fine_signature") or meta["signature"],
                          meta.get("split", "fixed"), case.scenario))
    return out


def _shows(case: Member, other: Member, replay: Replay) -> bool:
    """Does `case`'s minimized scenario, under `other`'s engine config, fail as `other` does?"""
    from mambafuzz.model.scenario import ScenarioError

    try:
        return replay(dataclasses.replace(case.scenario, engine=other.scenario.engine), other.split) == other.signature
    except (ScenarioError, ToolError):  # cannot replay it there: no link, the two stay apart
        return False


def link(first: Member, second: Member, replay: Replay | None) -> str | None:
    """Why one root cause explains both (`mechanism` or `replay`), or None."""
    if first.signature == second.signature and first.fine_signature == second.fine_signature:
        return "mechanism"
    if replay is not None and (_shows(first, second, replay) or _shows(second, first, replay)):
        return "replay"
    return None


def group(found: list[Member], replay: Replay | None = None,
          divergence: Callable[[Member], str | None] | None = None) -> list[dict]:
    """Groups in order of their first member: `{"root": path, "members": [{"path", "signature",
    "fine_signature", "why"[, "divergence"]}]}`, the root's `why` being "root". `divergence`:
    each finding's divergence key (None: none known), which gates every link (module docstring)."""
    if divergence is None:
        return _by_first_member(found, replay)
    keys = [divergence(m) for m in found]
    owner = list(range(len(found)))  # union-find over findings
    why: dict[int, str] = {}

    def root(i: int) -> int:
        while owner[i] != i:
            owner[i] = owner[owner[i]]
            i = owner[i]
        return i

    for i, m in enumerate(found):
        for j in range(i):
            if keys[i] is None or keys[i] != keys[j] or root(i) == root(j):
                continue
            reason = link(found[j], m, replay)
            if reason is None:
                continue
            a, b = sorted((root(i), root(j)))  # the earlier root stays a root: groups keep discovery order
            owner[b] = a
            if b == i:
                why[i] = reason
            else:  # `m` links two groups: the later one joins the earlier one through it
                why[b] = f"{reason} via {m.path.name}"
    rows: dict[int, list[dict]] = {}
    for i, m in enumerate(found):
        rows.setdefault(root(i), []).append(
            {"path": str(m.path), "signature": m.signature, "fine_signature": m.fine_signature,
             "why": why.get(i, "root"), "divergence": keys[i]})
    return [{"root": g[0]["path"], "members": g} for _, g in sorted(rows.items())]


def _by_first_member(found: list[Member], replay: Replay | None) -> list[dict]:
    groups: list[tuple[Member, list[dict]]] = []
    for m in found:
        entry = {"path": str(m.path), "signature": m.signature, "fine_signature": m.fine_signature}
        for first, rows in groups:
            why = link(first, m, replay)
            if why is not None:
                rows.append({**entry, "why": why})
                break
        else:
            groups.append((m, [{**entry, "why": "root"}]))
    return [{"root": str(first.path), "members": rows} for first, rows in groups]


def write(findings: Path, groups: list[dict]) -> Path:
    path = findings / GROUPS_FILE
    atomic_write(path, "".join(json.dumps(g) + "\n" for g in groups))
    return path


def read(findings: Path) -> list[dict] | None:
    """The groups a campaign wrote into `findings`, or None."""
    try:
        data = [json.loads(line) for line in (findings / GROUPS_FILE).read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    return [g for g in data if isinstance(g, dict)]
