"""How the `mambafuzz fuzz` supervisor and its worker processes talk: in data, both ways.

- Down: the supervisor writes a worker's whole configuration (`WorkerConfig`) to one JSON file
  and names it in one environment variable, `MAMBAFUZZ_WORKER_CONFIG`.  An environment
  variable, not argv, because libFuzzer's own -fork/-merge children re-run the target with
  argv only; they inherit the environment and so read the same file.
- Up: a worker prints JSON events, one per line, behind the prefix `@@event `: `started`
  (once it has imported vLLM and is ready to run inputs), `progress` (its counters),
  `finding` (what it filed: the judge's `mambafuzz.findings.Violation`, in its `to_json` keys,
  and where triage filed it), `tool_error` (mambafuzz failed on one input, kept; the worker goes
  on), `error` (why it cannot run) and `done`.  The supervisor acts on
  these alone; everything else a worker prints is log.  libFuzzer's own status lines are log
  too, read only for what no worker can know (libFuzzer's coverage and corpus counters).

This module imports nothing heavy: the supervisor uses it without importing vLLM.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

CONFIG_ENV = "MAMBAFUZZ_WORKER_CONFIG"
EVENT_PREFIX = "@@event "
EVENTS = ("started", "progress", "finding", "tool_error", "error", "done")


MIN_FUZZ_SECONDS = 1.0


@dataclass
class CampaignConfig:
    """One `mambafuzz fuzz` campaign as the supervisor runs it; each generator's launcher reads it."""

    generator: str
    split: str
    max_time: float
    runs: int
    jobs: int
    seed: int
    corpus: Path
    seed_dirs: list[Path]
    findings: Path
    known_dirs: list[Path]
    stop_on_first: bool
    minimize_budget: float
    rss_limit_mb: int
    libfuzzer_args: list[str] = field(default_factory=list)
    quiet: bool = False
    stats_file: Path | None = None  # CSV of the status lines: the coverage-over-time data
    patches: list[str] = field(default_factory=list)  # --patch specs every worker applies
    known_fix_dirs: list[str] = field(default_factory=list)  # --with-known-fixes: apply these bugs' fixes
    runner: str | None = None  # --runner: the model runner every scenario is run on
    scheduling: str | None = None  # --scheduling: the scheduling mode every scenario is run in
    target: str = "scheduler"  # --target: what judges an input (mambafuzz.search.fuzz_targets)
    base: str | None = None  # --base: PR mode, judged against this vLLM (mambafuzz.search.pr)
    efficiency_allowed: list[str] = field(default_factory=list)  # --allow-efficiency: figures the gate lets regress
    untriaged_dirs: list[Path] = field(default_factory=list)  # candidate fixes that label findings (corpus/untriaged)


@dataclass
class WorkerConfig:
    """Everything a worker needs; the defaults are what a bare `fuzz_scheduler.py CORPUS` run uses."""

    target: str = "scheduler"  # a registered fuzz target (mambafuzz.search.fuzz_targets)
    split: str = "fixed"
    findings: str = "findings"
    generator: str = "random"  # a registered generator (mambafuzz.search.generators)
    stop_on_first: bool = False
    minimize_budget: float = 30.0
    known_dirs: list[str] = field(default_factory=list)
    patches: list[str] = field(default_factory=list)  # --patch specs, applied to vLLM for every run
    known_fix_dirs: list[str] = field(default_factory=list)  # --with-known-fixes: these known bugs' fixes
    untriaged_dirs: list[str] = field(default_factory=list)  # untriaged candidates' fixes: labels, never drops
    conform_kernels: bool = False  # the target runs vLLM's worker kernels: Triton's CPU shim (its FuzzTarget says)
    runner: str | None = None  # a registered model runner: every scenario runs on it; None: each scenario's own engine.runner
    base: str | None = None  # PR mode: the base vLLM ("installed" or an overlay dir; mambafuzz.search.pr)
    # PR mode: resource figures the efficiency gate lets regress against the base (mambafuzz.search.pr.efficiency_gate)
    efficiency_allowed: list[str] = field(default_factory=list)
    # (conform target: the runner checked; None: both)
    scheduling: str | None = None  # sync | async | default: every scenario runs so; None: each scenario's own
    # the random generator's own loop (libFuzzer workers take these as libFuzzer flags instead)
    seed: int = 0
    max_time: float = 0.0
    runs: int = 0
    rss_limit_mb: int = 0
    replay_dirs: list[str] = field(default_factory=list)
    corpus: str = ""  # where a generator that keeps inputs (`pairs`) writes them; "" keeps none on disk
    # wall-clock (time.time()) end of the whole campaign, 0: none. --max-time counts from the
    # campaign's start, so a worker's own start-up (importing vLLM, instrumenting) comes out of it.
    deadline: float = 0.0
    # a new finding (not a known bug, not flaky, not pre-existing) raises target_runtime.NewFinding
    # once filed: a fuzzing service with no supervisor (ClusterFuzzLite) sees only crashes
    crash_on_new: bool = False

    def fuzz_seconds(self, budget: float, now: float | None = None) -> float:
        """How long this worker may fuzz: what is left of the campaign's deadline (at least one
        second, so a slow start still runs inputs), else `budget` as given."""
        if not self.deadline:
            return budget
        return max(MIN_FUZZ_SECONDS, self.deadline - (time.time() if now is None else now))

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def read(cls, path: str | Path) -> WorkerConfig:
        """The configuration in `path`; unknown keys are an error, so a stale worker is loud."""
        data = json.loads(Path(path).read_text())
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown worker settings {unknown}")
        return cls(**data)

    @classmethod
    def from_environment(cls) -> WorkerConfig:
        """The file named by MAMBAFUZZ_WORKER_CONFIG; when it is unset, `standalone` in a bundled
        target (PyInstaller sets `sys._MEIPASS`: ClusterFuzzLite's build), else the defaults."""
        path = os.environ.get(CONFIG_ENV)
        if path:
            return cls.read(path)
        bundle = getattr(sys, "_MEIPASS", None)
        return cls.standalone(Path(bundle)) if bundle else cls()

    @classmethod
    def standalone(cls, root: Path) -> WorkerConfig:
        """A target run by a fuzzing service (ClusterFuzzLite's bundled binary, .clusterfuzzlite/build.sh),
        which reads no events and reports only crashes: a new finding raises; the known bugs
        bundled under `root` (corpus/regressions, corpus/upstream, as `mambafuzz fuzz` defaults
        to) are not new; the atheris decoder; no minimization (the service keeps the crashing
        input, and a libFuzzer -timeout must not cut triage short: `mambafuzz repro --raw` and
        `mambafuzz minimize` take it from there). Findings are filed under ./findings."""
        return cls(generator="atheris", known_dirs=[str(root / "corpus" / d) for d in ("regressions", "upstream")],
                   minimize_budget=0.0, crash_on_new=True)


def emit(event: str, **data: Any) -> None:
    """Print one event line (flushed at once: the supervisor reads it live)."""
    assert event in EVENTS, event
    line = json.dumps({"event": event, "pid": os.getpid(), **data}, separators=(",", ":"))
    sys.stdout.write(EVENT_PREFIX + line + "\n")
    sys.stdout.flush()


def parse_event(line: str) -> dict[str, Any] | None:
    """The event on `line`, or None for a log line (or a garbled event, which is logged)."""
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        event = json.loads(line[len(EVENT_PREFIX):])
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("event") not in EVENTS:
        return None
    if event["event"] == "finding" and not isinstance(event.get("signature"), str):
        return None  # no Violation to read back
    return event
