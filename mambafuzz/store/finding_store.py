"""The findings directory as a database: it saves, fetches and lists findings (a case file with
a `finding` block, the raw input beside it under raw/), and knows nothing of how a finding was
judged.  What to file, and what its finding block says, is triage's business
(mambafuzz.search.triage), as Hypothesis' ExampleDatabase saves and fetches while its engine
shrinks.

Layout under the directory: `<key>.json` (a finding), `flaky-<key>.json` (one that did not
reproduce every time), `pre-existing/<key>.json` (PR mode: the base shows it too) and
`raw/<key>.<content hash><suffix>` (the inputs it came from); a key is made file-name safe
(`slug`).  Every write is atomic (mambafuzz.store.corpus.atomic_write).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from mambafuzz.model.scenario import Scenario
from mambafuzz.store.corpus import PRE_EXISTING, Case, atomic_write, case_json, content_name, iter_cases, load_case

STALE_TEMP_SECONDS = 300


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:120]


def sweep_stale_temporaries(directory: Path) -> int:
    """Remove `.name.*.tmp` files a killed writer left behind.  Only old ones: a fresh one may
    belong to another live process about to rename it into place."""
    removed = 0
    now = time.time()
    for p in directory.rglob(".*.tmp"):
        try:
            if now - p.stat().st_mtime > STALE_TEMP_SECONDS:
                p.unlink()
                removed += 1
        except OSError:
            pass
    return removed


def _quiet(msg: str) -> None:
    pass


class FiledSignatures(NamedTuple):
    new: set[str]  # fine signatures filed as new under a split (and the ones they were found with)
    pre_existing: set[str]  # fine signatures recorded as pre-existing (PR mode), under any split


class FindingStore:
    """The findings under `directory` (created; stale temporaries of killed writers swept)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        sweep_stale_temporaries(self.directory)

    def path_for(self, key: str, *, flaky: bool = False, pre_existing: bool = False) -> Path:
        """Where the finding keyed `key` is saved (a repro command names it before it exists)."""
        name = slug(key)
        if pre_existing:
            return self.directory / PRE_EXISTING / f"{name}.json"
        return self.directory / (f"flaky-{name}.json" if flaky else f"{name}.json")

    def save(self, path: Path, scenario: Scenario, finding: dict, note: str) -> Path:
        """Write `scenario` with its `finding` block and `note` to `path` (from `path_for`)."""
        atomic_write(path, case_json(scenario, finding=finding, note=note))
        return path

    def save_raw(self, key: str, data: str | bytes, suffix: str) -> Path:
        """Keep an input a finding came from, named by its content."""
        path = self.directory / "raw" / f"{slug(key)}.{content_name(data, suffix)}"
        atomic_write(path, data)
        return path

    def fetch(self, path: str | Path) -> Case:
        return load_case(path)

    def list(self) -> Iterator[Case]:
        """Every saved finding (a case with a `finding` block), in file order."""
        for case in iter_cases([self.directory], warn=_quiet):
            if isinstance(case.extra.get("finding"), dict):
                yield case

    def filed_signatures(self, split: str) -> FiledSignatures:
        """The fine signatures on file: filed as new under `split` (an older finding without
        one counts by its coarse signature), and recorded as pre-existing."""
        out = FiledSignatures(set(), set())
        for case in self.list():
            meta = case.extra["finding"]
            if meta.get("pre_existing") and meta.get("signature"):
                out.pre_existing.add(meta.get("fine_signature") or meta["signature"])
            elif meta.get("split") == split and meta.get("signature"):
                out.new.add(meta.get("fine_signature") or meta["signature"])
                if meta.get("fine_signature_found"):
                    out.new.add(meta["fine_signature_found"])
        return out
