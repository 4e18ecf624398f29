"""Corpus inputs are either scenario JSON (seeds, findings) or raw libFuzzer bytes; both
decode through the one input model."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from fuzz.generate import scenario_from_bytes
from fuzz.scenario import Scenario, validate
from fuzz.target_runtime import decode_json_case

MAX_INPUT_BYTES = 1 << 20


@lru_cache(maxsize=1)
def _hypothesis_decoder():
    from fuzz.target_runtime import _HypothesisDecoder

    return _HypothesisDecoder()


DECODERS = ("bytes", "hypothesis")


def decode_input(data: bytes, decoder: str = "bytes") -> Scenario | None:
    """Exactly what the fuzz targets do: scenario JSON when it parses, else the bytes decoder
    (libFuzzer's mutants of JSON seeds are mostly no longer JSON, and still count).  `decoder`
    is the target's: `bytes` (atheris, random) or `hypothesis` (the Hypothesis strategy)."""
    from_bytes = _hypothesis_decoder() if decoder == "hypothesis" else scenario_from_bytes
    scenario = decode_json_case(data) or from_bytes(data)
    if scenario is None or validate(scenario):
        return None
    return scenario


def iter_input_files(dirs: list[Path], stats: dict | None = None, warn=None) -> Iterator[tuple[Path, bytes]]:
    """Regular, readable files under `dirs`; junk, symlinks and unreadable files are skipped
    with one warning line each and counted in stats['skipped']."""
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    stats = stats if stats is not None else {}
    stats.setdefault("skipped", 0)
    stats.setdefault("loaded", 0)
    for d in dirs:
        d = Path(d)
        if not d.exists():
            continue
        entries = sorted(d.rglob("*")) if d.is_dir() else [d]
        for p in entries:
            if p.name.startswith(".") or "raw" in p.relative_to(d).parts[:-1]:
                continue
            if p.is_symlink():
                warn(f"{p}: skipped, a symlink")
                stats["skipped"] += 1
                continue
            if p.is_dir():
                continue
            if not p.is_file():
                warn(f"{p}: skipped, not a regular file")
                stats["skipped"] += 1
                continue
            try:
                if p.stat().st_size > MAX_INPUT_BYTES:
                    warn(f"{p}: skipped, larger than {MAX_INPUT_BYTES} bytes")
                    stats["skipped"] += 1
                    continue
                data = p.read_bytes()
            except OSError as exc:
                warn(f"{p}: skipped, unreadable ({exc.strerror or exc})")
                stats["skipped"] += 1
                continue
            stats["loaded"] += 1
            yield p, data
