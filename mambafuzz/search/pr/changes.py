"""How many changes separate the PR's vLLM from its base: the PR job's cheapest sound grouping.

A finding fails a PR only when it is a violation on the PR's vLLM and clean on the base
(mambafuzz.search.pr.base_process). When the two differ by one change (one hunk of source, or one
planted patch), every such finding needs that change: without it the base runs clean. So all
of the PR's new findings are one root cause, whatever their symptoms, and the symptom rules of
mambafuzz.search.pr.grouping (which never join a crash to a stall) are not needed. With two changes
or more nothing is concluded here: telling them apart would take replaying each finding with one
change reverted at a time (not done).

The PR's side is this process: the vLLM it imports (an overlay on PYTHONPATH, or the installed
one) plus the planted bug MAMBAFUZZ_MUTANT names. The base is `installed` (the environment's
vLLM without the overlay or the bug) or a directory holding `vllm/`.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

from mambafuzz.search.pr.base_process import INSTALLED, base_env

MANY = 1_000  # "more than one change": what changes_against says when it cannot count


def patch_changes(patches: list) -> int:
    """Changes in a planted bug's patches: each edit of a `Rewrite`, one for any other patch (a
    wrapper replaces one function)."""
    return sum(len(getattr(p, "edits", ()) or ()) or 1 for p in patches)


def differing_files(pr: Path, base: Path) -> list[Path]:
    """The .py files (relative to the package) that differ between two vLLM package trees; a file
    on one side only differs."""
    if pr.resolve() == base.resolve():
        return []
    names = {p.relative_to(pr) for p in pr.rglob("*.py")} | {p.relative_to(base) for p in base.rglob("*.py")}
    return [n for n in sorted(names)
            if not (base / n).is_file() or not (pr / n).is_file() or (base / n).read_bytes() != (pr / n).read_bytes()]


def tree_changes(pr: Path, base: Path) -> int:
    """Changes between two vLLM package trees (their .py files): the hunks of the one file that
    differs, when only one does; otherwise the number of files that differ (a file on one side
    only counts one), a lower bound that is enough to tell one change from several without
    diffing a whole release."""
    differ = differing_files(pr, base)
    if len(differ) != 1:
        return len(differ)
    a, b = base / differ[0], pr / differ[0]
    if not a.is_file() or not b.is_file():
        return 1
    matcher = difflib.SequenceMatcher(None, a.read_text(errors="replace").splitlines(),
                                      b.read_text(errors="replace").splitlines(), autojunk=False)
    return sum(tag != "equal" for tag, *_ in matcher.get_opcodes())


def base_package_dir(where: str) -> Path | None:
    """The base's `vllm/` directory: DIR/vllm, or where the base process would import the
    installed vLLM from (found without importing it); None when that cannot be told."""
    if where != INSTALLED:
        return Path(where) / "vllm"
    try:
        out = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('vllm').origin)"],
                             env=base_env(where), capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    origin = out.stdout.strip()
    return Path(origin).parent if out.returncode == 0 and origin else None


def _pr_against(where: str) -> tuple[list, Path, Path | None]:
    """The PR's side against the base `where`: the planted bug's patches (MAMBAFUZZ_MUTANT), the
    vLLM tree this process imports, and the base's tree (None when it cannot be found)."""
    import importlib.util

    from mambafuzz.tools.mutation import planting

    name = os.environ.get(planting.MUTANT_ENV)
    planted = list(planting.patches(name)) if name else []
    return planted, Path(importlib.util.find_spec("vllm").origin).parent, base_package_dir(where)


def changes_against(where: str) -> int:
    """The changes between this process's vLLM (tree and planted bug) and the base `where`;
    MANY when the base's tree cannot be found (then nothing is concluded)."""
    planted, here, base = _pr_against(where)
    return MANY if base is None else patch_changes(planted) + tree_changes(here, base)


def one_group(groups: list[dict]) -> list[dict]:
    """`groups` as one group, in discovery order (the first group's root stays the root): for a PR
    one change away from its base. Members keep why a symptom rule linked them; the other roots
    join as "one change"."""
    if len(groups) <= 1:
        return groups
    members = [dict(m) for m in groups[0]["members"]]
    for g in groups[1:]:
        members += [{**m, "why": "one change" if m["why"] == "root" else m["why"]} for m in g["members"]]
    return [{"root": groups[0]["root"], "members": members, "cause": "the PR's one change against its base"}]


# Where the PR job spends its time (ci/pr-fuzz): the scheduler target judges what vLLM's scheduler and
# KV-cache manager decide; the conform target holds the kernel model against vLLM's worker code (the
# metadata builders, the mamba state copies, V2's model state), which the scheduler target never calls.
# A path under WORKER_PATHS is worker code (the package-relative prefixes); any other change is the
# scheduler's side.
WORKER_PATHS = ("v1/worker/", "model_executor/layers/mamba/", "v1/attention/backends/")
# The conform target's share of the time: the PR changes worker code only, both sides (or the
# change cannot be told), the scheduler's side only.
CONFORM_SHARE = {"worker": 0.8, "both": 0.4, "scheduler": 0.15}


def changed_paths(where: str) -> list[str] | None:
    """The package-relative paths the PR's vLLM (tree and planted bug) changes against the base
    `where`; None when the base's tree cannot be found."""
    planted, here, base = _pr_against(where)
    if base is None:
        return None
    return ([p.target.partition(":")[0].removeprefix("vllm.").replace(".", "/") + ".py" for p in planted]
            + [str(n) for n in differing_files(here, base)])


def time_split(paths: list[str] | None, seconds: int) -> tuple[int, int, str]:
    """(scheduler seconds, conform seconds, why) for a PR changing `paths` (None: unknown)."""
    if paths is None:
        side = "both"
        why = "the base's tree cannot be found"
    else:
        worker = [p for p in paths if p.startswith(WORKER_PATHS)]
        side = "both" if not paths else "worker" if len(worker) == len(paths) else "scheduler" if not worker else "both"
        why = (f"{len(worker)} of {len(paths)} changed file(s) are worker code" if paths
               else "nothing differs from the base")
    conform = round(seconds * CONFORM_SHARE[side])
    return seconds - conform, conform, f"{side}: {why}"


def main(argv: list[str]) -> int:
    """`python -m mambafuzz.search.pr.changes split BASE SECONDS`: one line, `SCHED CONFORM WHY`."""
    if len(argv) != 3 or argv[0] != "split" or not argv[2].isdigit():
        print("usage: python -m mambafuzz.search.pr.changes split BASE SECONDS", file=sys.stderr)
        return 2
    sched, conform, why = time_split(changed_paths(argv[1]), int(argv[2]))
    print(sched, conform, why)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
