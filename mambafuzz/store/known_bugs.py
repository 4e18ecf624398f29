"""Known bugs as root causes, not symptoms: each one is its cases plus the fix that makes them
pass, so a new finding can be checked against the fix instead of matched by signature.

- `corpus/upstream/<name>/`: cases (`*.json`) and a candidate fix (`fix.py`, its `PATCHES`).
- a directory of cases without a fix (`corpus/regressions`): known-bad splits; their fix is
  swapping in the installed split (`fixed`), and they are bugs of a split only when their
  `expected` table says that split fails.

Kept free of the pipeline so the bridge (`mambafuzz.sim.bridge`) can apply fixes while it is still importing.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from mambafuzz.sim import patching
from mambafuzz.store.corpus import Case, iter_cases

FIX_FILE = "fix.py"
REGRESSION_FIX_SPLIT = "fixed"


@dataclass
class KnownBug:
    name: str
    cases: list[Case]
    signatures: set[str]
    patches: list[patching.Patch] = field(default_factory=list)
    fix_split: str | None = None  # replay under this split instead of the one under test
    fix_error: str | None = None  # why the fix no longer applies to the installed vLLM
    directory: Path | None = None

    @property
    def kinds(self) -> set[str]:
        return {s.split(":")[0] for s in self.signatures}

    @property
    def has_usable_fix(self) -> bool:
        return self.fix_error is None and (bool(self.patches) or self.fix_split is not None)


def _fix_dirs(root: Path) -> list[Path]:
    if (root / FIX_FILE).is_file():
        return [root]
    return sorted(d for d in root.iterdir() if d.is_dir() and (d / FIX_FILE).is_file())


def _quiet(msg: str) -> None:
    pass


def load_fix_bug(directory: Path) -> KnownBug:
    """One upstream finding: its cases, their recorded signatures and its fix (or why the fix
    no longer applies)."""
    cases = list(iter_cases([directory], warn=_quiet))
    sigs = {c.extra["finding"]["signature"] for c in cases
            if isinstance(c.extra.get("finding"), dict) and isinstance(c.extra["finding"].get("signature"), str)}
    bug = KnownBug(directory.name, cases, sigs, directory=directory)
    try:
        bug.patches = patching.load_patches(str(directory / FIX_FILE))
    except patching.PatchSpecError as exc:
        bug.fix_error = str(exc)
        return bug
    bug.fix_error = patching.check_applies(bug.patches)
    return bug


def load_known_bugs(dirs: list[Path], split: str, signature_of=None) -> list[KnownBug]:
    """Every known bug under `dirs` that can explain a finding under `split`. Fix directories
    apply to every split; a fixless case directory gives one bug per directory, made of the
    cases whose `expected` verdict under `split` is a failure (`signature_of(scenario, split)`
    replays them when they record no signature)."""
    bugs: list[KnownBug] = []
    for root in (Path(d) for d in dirs):
        if not root.is_dir():
            continue
        fix_dirs = _fix_dirs(root)
        bugs += [load_fix_bug(d) for d in fix_dirs]
        loose = [c for c in iter_cases([root], warn=_quiet) if not any(d in c.path.parents for d in fix_dirs)]
        if split == REGRESSION_FIX_SPLIT:
            continue  # a fixless case is a bug of a known-bad split; the installed split is its fix
        failing = [c for c in loose if c.expected.get(split, "clean") != "clean"]
        sigs: set[str] = set()
        for c in failing:
            meta = c.extra.get("finding")
            if isinstance(meta, dict) and meta.get("split") == split and isinstance(meta.get("signature"), str):
                sigs.add(meta["signature"])
            elif signature_of is not None and (sig := signature_of(c.scenario, split)):
                sigs.add(sig)
        if failing:
            bugs.append(KnownBug(f"{root.name}[{split}]", failing, sigs, fix_split=REGRESSION_FIX_SPLIT,
                                 directory=root))
    return bugs


UNTRIAGED_FIX_GLOB = "candidate_fix_*.py"
UNTRIAGED_PREFIX = "untriaged candidate "


def untriaged_candidates(dirs: list[Path]) -> list[KnownBug]:
    """The candidate fixes of untriaged findings (`corpus/untriaged/candidate_fix_*.py`), each as a
    bug without cases named "untriaged candidate <fix>". They are not known bugs: triage never drops
    a finding for one, it only says which open candidate's fix makes the finding replay clean."""
    out = []
    for root in (Path(d) for d in dirs if Path(d).is_dir()):
        for path in sorted(root.glob(UNTRIAGED_FIX_GLOB)):
            bug = KnownBug(UNTRIAGED_PREFIX + path.stem.removeprefix("candidate_fix_"), [], set(), directory=root)
            try:
                bug.patches = patching.load_patches(str(path))
            except patching.PatchSpecError as exc:
                bug.fix_error = str(exc)
            else:
                bug.fix_error = patching.check_applies(bug.patches)
            out.append(bug)
    return out


def known_fix_bugs(dirs: list[Path]) -> list[KnownBug]:
    """The known bugs under `dirs` that come with a fix (`fix_error` says when it no longer applies)."""
    return [load_fix_bug(d) for root in (Path(d) for d in dirs if Path(d).is_dir()) for d in _fix_dirs(root)]


def apply_known_fixes(dirs: list[Path], warn=None) -> list[KnownBug]:
    """Apply the fix of every known bug under `dirs` for the rest of this process
    (`--with-known-fixes`); a fix that no longer applies is named on stderr and skipped."""
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr, flush=True))
    applied = []
    for bug in known_fix_bugs(dirs):
        if bug.fix_error is not None:
            warn(f"known fix {bug.name} does not apply to the installed vLLM: {bug.fix_error}")
            continue
        for p in bug.patches:
            patching.apply_one(p)
        applied.append(bug)
    return applied
