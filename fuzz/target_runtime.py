"""What one fuzz execution does, whatever engine produced the input: decode, evaluate, file.

Configured by environment variables so that libFuzzer's `-fork`/`-jobs` children, which
re-run the target script with argv only, behave like their parent:
  MAMBAFUZZ_SPLIT, MAMBAFUZZ_FINDINGS, MAMBAFUZZ_DECODER (bytes|hypothesis),
  MAMBAFUZZ_STOP_ON_FIRST, MAMBAFUZZ_ENGINE, MAMBAFUZZ_MINIMIZE_BUDGET.
Status lines start with "@@" and are read by the `mambafuzz fuzz` supervisor.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

from fuzz import generate
from fuzz.finding_store import FindingStore, known_signatures
from fuzz.pipeline import evaluate
from fuzz.scenario import Scenario, ScenarioError, from_json, validate

STATUS_EVERY = 3.0


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


class Runtime:
    def __init__(self, split: str, findings: str, decoder: str = "bytes", engine: str = "atheris",
                 stop_on_first: bool = False, minimize_budget: float = 30.0, known_dirs: list[str] | None = None):
        from pathlib import Path

        self.split = split
        self.engine = engine
        self.stop_on_first = stop_on_first
        known = known_signatures([Path(d) for d in (known_dirs or [])], split)
        self.store = FindingStore(Path(findings), split, known=known, minimize_budget=minimize_budget)
        self.decode_bytes = _HypothesisDecoder() if decoder == "hypothesis" else generate.scenario_from_bytes
        self.execs = 0
        self.rejected = 0
        self.started = time.monotonic()
        self._last_status = self.started

    @classmethod
    def from_env(cls) -> Runtime:
        env = os.environ
        return cls(split=env.get("MAMBAFUZZ_SPLIT", "fixed"), findings=env.get("MAMBAFUZZ_FINDINGS", "findings"),
                   decoder=env.get("MAMBAFUZZ_DECODER", "bytes"), engine=env.get("MAMBAFUZZ_ENGINE", "atheris"),
                   stop_on_first=env.get("MAMBAFUZZ_STOP_ON_FIRST") == "1",
                   minimize_budget=float(env.get("MAMBAFUZZ_MINIMIZE_BUDGET", "30")),
                   known_dirs=[d for d in env.get("MAMBAFUZZ_KNOWN", "").split(os.pathsep) if d])

    def decode(self, data: bytes) -> Scenario | None:
        scenario = decode_json_case(data) or self.decode_bytes(data)
        if scenario is None or validate(scenario):
            return None
        return scenario

    def run_scenario(self, scenario: Scenario, origin: dict, raw: bytes | None = None) -> bool:
        """Evaluate once; file a finding if any.  Returns True when a new finding was filed."""
        self.execs += 1
        try:
            v = evaluate(scenario, self.split, efficiency=False).verdict
        except ScenarioError:
            self.rejected += 1
            return False
        filed = None
        if not v.clean:
            origin = dict(origin, engine=self.engine, execs=self.execs,
                          seconds=round(time.monotonic() - self.started, 2))
            filed = self.store.handle(scenario, v.primary.signature, v.primary.message, origin, raw)
        self.maybe_status()
        if filed is not None and self.stop_on_first:
            self.status(final=True)
            sys.stdout.flush()
            os._exit(1)
        return filed is not None

    def test_one_input(self, data: bytes) -> None:
        scenario = self.decode(data)
        if scenario is None:
            self.rejected += 1
            self.maybe_status()
            return
        self.run_scenario(scenario, {"input": "libfuzzer"}, raw=data)

    def maybe_status(self) -> None:
        now = time.monotonic()
        if now - self._last_status >= STATUS_EVERY:
            self._last_status = now
            self.status()

    def status(self, final: bool = False) -> None:
        print(f"@@stat pid={os.getpid()} execs={self.execs} rejected={self.rejected} "
              f"findings={len(self.store.filed)} dups={self.store.duplicates} "
              f"seconds={time.monotonic() - self.started:.1f} rss_mb={current_rss_mb():.0f}"
              f"{' final=1' if final else ''}", flush=True)


def current_rss_mb() -> float:
    """Resident set size now (not the peak), from /proc."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (OSError, ValueError, IndexError):
        return 0.0
