"""Corpus inputs are either scenario JSON (seeds, findings) or raw libFuzzer bytes; both
decode through the one input model.  The fuzz targets (mambafuzz.search.target_runtime), the random
worker, corpus tools and `mambafuzz repro --raw` all decode through `decode_input`."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path

from mambafuzz.model import generate
from mambafuzz.model.scenario import Scenario, ScenarioError, from_json, validate

MAX_INPUT_BYTES = 1 << 20
# Files beside a case that are not inputs: a finding's analysis (.md) and candidate fix (.py).
COMPANION_SUFFIXES = (".md", ".py")


def decode_json_case(data: bytes) -> Scenario | None:
    """Seed files are scenario JSON; take them as they are when they parse."""
    if not data.lstrip().startswith(b"{"):
        return None
    try:
        raw = json.loads(data)
        return from_json(raw)
    except (ValueError, RecursionError, ScenarioError, TypeError, AttributeError):
        return None


class _HypothesisDecoder:
    def __init__(self) -> None:
        from hypothesis import HealthCheck, given, settings

        self._drawn: list[Scenario] = []

        @settings(database=None, deadline=None, suppress_health_check=list(HealthCheck))
        @given(generate.scenarios())
        def _collect(scenario: Scenario) -> None:
            self._drawn.append(scenario)

        self._fuzz_one_input = _collect.hypothesis.fuzz_one_input

    def __call__(self, data: bytes) -> Scenario | None:
        self._drawn.clear()
        self._fuzz_one_input(pad_with_own_entropy(data))
        return self._drawn[-1] if self._drawn else None


PAD_TO = 2048


def pad_with_own_entropy(data: bytes) -> bytes:
    """Hypothesis rejects a buffer that runs out mid-draw; extend short inputs with bytes from a
    PRNG seeded by the input itself, so every input decodes and libFuzzer's mutations of the
    leading bytes still steer the leading draws (the same idea as BytesSource's tail)."""
    if len(data) >= PAD_TO:
        return data
    return data + random.Random(data).randbytes(PAD_TO - len(data))


@lru_cache(maxsize=1)
def _hypothesis_decoder() -> _HypothesisDecoder:
    return _HypothesisDecoder()


# How bytes become a scenario, per decoder a generator names (mambafuzz.search.generators): a factory, so
# the Hypothesis decoder (and Hypothesis) is built only when used.
DECODERS: dict[str, Callable[[], Callable[[bytes], Scenario | None]]] = {
    "bytes": lambda: generate.scenario_from_bytes,
    "hypothesis": _hypothesis_decoder,
}


def decode_input(data: bytes, decoder: str = "bytes") -> Scenario | None:
    """Exactly what the fuzz targets do: scenario JSON when it parses, else the bytes decoder
    (libFuzzer's mutants of JSON seeds are mostly no longer JSON, and still count).  `decoder`
    is the generator's, one of DECODERS: `bytes` (atheris, random) or `hypothesis` (the Hypothesis
    strategy); an unknown one is a one-line ValueError."""
    if decoder not in DECODERS:
        raise ValueError(f"unknown decoder {decoder!r} (one of {', '.join(DECODERS)})")
    from_bytes = DECODERS[decoder]()
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
            if p.name.startswith(".") or "raw" in p.relative_to(d).parts[:-1] or "__pycache__" in p.parts:
                continue
            if p.suffix in COMPANION_SUFFIXES:  # a finding's analysis or fix beside its cases, not an input
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
