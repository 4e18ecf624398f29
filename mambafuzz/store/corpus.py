"""Scenario files on disk: loading with one-line errors, atomic writes, and directory walks
that skip junk with a warning instead of failing."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mambafuzz.findings import verdict_kinds
from mambafuzz.model.inputs import COMPANION_SUFFIXES
from mambafuzz.model.runners import RUNNERS
from mambafuzz.model.scenario import Scenario, ScenarioError, from_json
from mambafuzz.store import vllm_expectations

MAX_FILE_BYTES = 1 << 20


# The engine tier's verdicts per split, for cases without a `finding` block (findings keep
# theirs inside `finding`; see mambafuzz/engine_tier/confirmation.py).
ENGINE_CONFIRMATION = "engine_confirmation"


class CaseError(ValueError):
    """A case file that cannot be used; str() is one line naming the file and the problem."""


class NotJsonText(CaseError):
    """The file is not UTF-8 JSON at all (a raw fuzzing input, perhaps), as opposed to a JSON
    case with bad fields."""


def split_key(key: str) -> tuple[str, str | None]:
    """An `expected` key: `split` (every model runner) or `split@runner` (that runner only)."""
    split, _, runner = key.partition("@")
    return split, runner or None


def expected_for(expected: dict[str, str], split: str, runner: str | None) -> str | None:
    """The expected kind under `split` on `runner`: a runner's own entry wins over the split's."""
    if runner is not None and f"{split}@{runner}" in expected:
        return expected[f"{split}@{runner}"]
    return expected.get(split)


@dataclass
class Case:
    path: Path
    scenario: Scenario
    expected: dict[str, str] = field(default_factory=dict)  # split or split@runner -> kind
    extra: dict[str, Any] = field(default_factory=dict)  # note, origin, finding, engine_confirmation: verbatim


def parse_case(text: str, where: str) -> Case:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotJsonText(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise NotJsonText(f"{where}: not valid JSON (nested too deeply)") from None
    try:
        scenario = from_json(raw)
    except ScenarioError as exc:
        raise CaseError(f"{where}: {'; '.join(exc.problems)}") from None
    confirmation = raw.get(ENGINE_CONFIRMATION)
    if confirmation is not None and not (isinstance(confirmation, dict) and all(
            isinstance(k, str) and isinstance(v, dict) for k, v in confirmation.items())):
        raise CaseError(f"{where}: {ENGINE_CONFIRMATION} must map split names to confirmation objects")
    expected = raw.get("expected", {})
    kinds = verdict_kinds()  # clean or a failing kind of the oracle registry (mambafuzz.findings)
    if not isinstance(expected, dict) or any(
        not isinstance(k, str) or v not in kinds or split_key(k)[1] not in (None, *RUNNERS)
        for k, v in expected.items()
    ):
        raise CaseError(f"{where}: expected must map split names (or split@runner, runner one of "
                        f"{', '.join(RUNNERS)}) to one of {', '.join(kinds)}")
    by_vllm = raw.get(vllm_expectations.KEY)
    if by_vllm is not None and (bad := vllm_expectations.problems(by_vllm, kinds)):
        raise CaseError(f"{where}: {bad[0]}")
    extra = {k: raw[k] for k in ("note", "origin", "finding", ENGINE_CONFIRMATION, vllm_expectations.KEY) if k in raw}
    return Case(Path(where), scenario, vllm_expectations.for_installed(dict(expected), by_vllm), extra)


def read_case_bytes(path: str | os.PathLike, max_bytes: int = MAX_FILE_BYTES, too_big: str = "") -> bytes:
    """A file's bytes, with every way of not getting them as a one-line CaseError (`too_big`
    is appended to the message for a file over `max_bytes`)."""
    p = Path(path)
    try:
        if not p.is_file():
            raise CaseError(f"{p}: not a regular file" if p.exists() else f"{p}: no such file")
        if p.stat().st_size > max_bytes:
            raise CaseError(f"{p}: larger than {max_bytes} bytes{too_big}")
        return p.read_bytes()
    except CaseError:
        raise
    except OSError as exc:
        raise CaseError(f"{p}: cannot read ({exc.strerror or exc})") from None


def read_case_text(path: str | os.PathLike) -> str:
    """A case file's text, with every way of not getting it as a one-line CaseError."""
    data = read_case_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise NotJsonText(f"{Path(path)}: not UTF-8 text") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as Path.read_text reads


def load_case(path: str | os.PathLike) -> Case:
    case = parse_case(read_case_text(path), str(path))
    case.path = Path(path)
    return case


def case_json(scenario: Scenario, expected: dict[str, str] | None = None, **extra: Any) -> str:
    raw = scenario.to_json()
    if expected:
        raw["expected"] = dict(expected)
    for k, v in extra.items():
        if v is not None:
            raw[k] = v
    return json.dumps(raw, indent=1) + "\n"


def _umask() -> int:
    """The process umask: from /proc where Linux shows it, else by setting it and straight back
    (which briefly changes it for other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, data: str | bytes) -> None:
    """Write to a temporary file in the same directory, fsync it, then rename it into place:
    a reader sees the old file or the whole new one, never a torn one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    blob = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it 0600; a plain open() would honour the umask
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def content_name(data: str | bytes, suffix: str = ".json") -> str:
    blob = data.encode() if isinstance(data, str) else data
    return hashlib.sha1(blob).hexdigest()[:16] + suffix


PRE_EXISTING = "pre-existing"  # FINDINGS/pre-existing/: what a PR's base shows too (never new)


@dataclass
class WalkStats:
    loaded: int = 0
    skipped: int = 0


def iter_cases(paths: list[str | os.PathLike], stats: WalkStats | None = None, warn=None) -> Iterator[Case]:
    """Every usable case under `paths` (files or directories, sorted); anything else is
    skipped with one warning line, and counted."""
    stats = stats if stats is not None else WalkStats()
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    for root in paths:
        root = Path(root)
        if root.is_dir():
            files = sorted(p for p in root.rglob("*") if not p.name.startswith("."))
        else:
            files = [root]
        for p in files:
            if p.is_symlink():
                warn(f"{p}: skipped, a symlink")
                stats.skipped += 1
                continue
            if p.is_dir() or p.suffix in COMPANION_SUFFIXES or "__pycache__" in p.parts:
                continue
            if not p.is_file():
                warn(f"{p}: skipped, not a regular file")
                stats.skipped += 1
                continue
            if p.suffix != ".json":
                warn(f"{p}: skipped, not a .json scenario")
                stats.skipped += 1
                continue
            try:
                case = load_case(p)
            except CaseError as exc:
                warn(f"{exc} (skipped)")
                stats.skipped += 1
                continue
            stats.loaded += 1
            yield case
