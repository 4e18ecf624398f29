"""What one fuzz execution does, whatever engine produced the input: decode, evaluate, file.

Configured by environment variables so that libFuzzer's `-fork`/`-jobs` children, which
re-run the target script with argv only, behave like their parent:
  MAMBAFUZZ_SPLIT, MAMBAFUZZ_FINDINGS, MAMBAFUZZ_DECODER (bytes|hypothesis),
  MAMBAFUZZ_STOP_ON_FIRST, MAMBAFUZZ_ENGINE, MAMBAFUZZ_MINIMIZE_BUDGET, MAMBAFUZZ_RUNNER (v1|v2;
  unset: each scenario's own engine.runner, else vLLM's default).
Status lines start with "@@" and are read by the `mambafuzz fuzz` supervisor.
"""

from __future__ import annotations

import os
import sys
import time

from fuzz.finding_store import FindingStore, known_signatures
from fuzz.inputs import decode_input
from fuzz.pipeline import evaluate
from fuzz.scenario import Scenario, ScenarioError, with_runner

STATUS_EVERY = 3.0


class Runtime:
    def __init__(self, split: str, findings: str, decoder: str = "bytes", engine: str = "atheris",
                 stop_on_first: bool = False, minimize_budget: float = 30.0, known_dirs: list[str] | None = None,
                 runner: str | None = None):
        from pathlib import Path

        self.split = split
        self.runner = runner  # applied to every scenario, so a filed finding replays on the same runner
        self.engine = engine
        self.stop_on_first = stop_on_first
        known = known_signatures([Path(d) for d in (known_dirs or [])], split, runner)
        self.store = FindingStore(Path(findings), split, known=known, minimize_budget=minimize_budget)
        self.decoder = decoder
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
                   known_dirs=[d for d in env.get("MAMBAFUZZ_KNOWN", "").split(os.pathsep) if d],
                   runner=env.get("MAMBAFUZZ_RUNNER") or None)

    def decode(self, data: bytes) -> Scenario | None:
        return decode_input(data, self.decoder)

    def run_scenario(self, scenario: Scenario, origin: dict, raw: bytes | None = None) -> bool:
        """Evaluate once; file a finding if any.  Returns True when a new finding was filed."""
        self.execs += 1
        try:
            scenario = with_runner(scenario, self.runner)
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
