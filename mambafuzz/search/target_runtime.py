"""What one fuzz execution does, whatever generator produced the input: decode, judge, file.

The target (`WorkerConfig.target`) decides what judges an input: `scheduler` evaluates it with
the oracles (mambafuzz.checks.pipeline), `conform` holds the kernel model against vLLM's own worker code
(mambafuzz.conform.target).  Either way an execution is one input judged; one that cannot run is
counted as rejected, not executed.

Configured by one `WorkerConfig` (mambafuzz.search.worker_protocol: a file named in the environment, so
libFuzzer's -fork/-merge children, which re-run the target with argv only, behave like their
parent).  Reports to the `mambafuzz fuzz` supervisor in JSON events (`progress`, `finding`,
`done`), never in free text.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path
from typing import NoReturn

from mambafuzz.exit_codes import EXIT_TOOL, ToolError
from mambafuzz.model.generate import RandomSource, draw_worker_rows
from mambafuzz.model.inputs import decode_input, decode_json_case
from mambafuzz.model.scenario import Scenario, ScenarioError, with_runner, with_scheduling
from mambafuzz.search import fuzz_targets, generators
from mambafuzz.search.triage import Filed
from mambafuzz.search.worker_protocol import WorkerConfig, emit
from mambafuzz.store.corpus import atomic_write, content_name
from mambafuzz.store.finding_store import FindingStore

STATUS_EVERY = 3.0


class NewFinding(Exception):
    """A new finding, raised once it is filed when `WorkerConfig.crash_on_new` (a fuzzing service
    with no supervisor sees only crashes: ClusterFuzzLite keeps the input and reports the message)."""


class Runtime:
    def __init__(self, config: WorkerConfig):
        """Runs inputs in a process its entry point prepared (mambafuzz.search.startup.prepare_worker)."""
        self.config = config
        store = FindingStore(Path(config.findings))
        # the target's triage stage, and (conform) its first judge and row-class counts: mambafuzz.search.fuzz_targets
        built = fuzz_targets.get(config.target).build(config, store)
        self.triage, self.row_classes = built.triage, built.row_classes
        first_judge = built.first_judge  # the first judgement of each input, when it counts more than triage's re-checks
        self.judge = self.triage.judge
        self.verdict = (first_judge or self.judge).verdict
        self.execs = 0
        self.modes = {"sync": 0, "async": 0}  # executions per scheduling mode (unset counts as vLLM's: async)
        self.rejected = 0
        self.tool_errors = 0  # inputs mambafuzz itself failed on (kept under findings/tool-errors/)
        self.started = time.monotonic()
        self._last_status = self.started
        self.feedback: dict = {}  # a generator's own counters for its progress events (`pairs`: cov, corpus)

    @classmethod
    def from_environment(cls) -> Runtime:
        return cls(WorkerConfig.from_environment())

    def decode(self, data: bytes) -> Scenario | None:
        """A raw input as the target runs it: the conform target draws the worker's row edges
        (mambafuzz.model.generate.draw_worker_rows) on top of a generated scenario, from a PRNG
        the input's bytes seed, so the same bytes always give the same scenario; a scenario file
        runs as written."""
        scenario = decode_input(data, generators.get(self.config.generator).decoder)
        draws_rows = fuzz_targets.get(self.config.target).draws_worker_rows
        if scenario is not None and draws_rows and decode_json_case(data) is None:
            scenario = draw_worker_rows(RandomSource(random.Random(data)), scenario)
        return scenario

    def run_scenario(self, scenario: Scenario, origin: dict, raw: bytes | None = None) -> bool:
        """Judge once; file a finding if any.  Returns True when a new finding was filed."""
        try:
            # every scenario runs on the campaign's runner, so a filed finding replays on it
            scenario = with_scheduling(with_runner(scenario, self.config.runner), self.config.scheduling)
            violation = self.verdict(scenario)
            self.execs += 1
            self.modes["sync" if scenario.engine.async_scheduling is False else "async"] += 1
            filed = None
            if violation is not None:
                origin = dict(origin, engine=self.config.generator, target=self.config.target, execs=self.execs,
                              seconds=round(time.monotonic() - self.started, 2))
                filed = self.triage.handle(scenario, violation, origin, raw)
                if filed is not None:
                    self.report_finding(filed)
        except ScenarioError:
            self.rejected += 1
            return False
        except ToolError as exc:
            if exc.stops_worker:  # an unsupported vLLM: every later input would fail the same way
                self.stop_on_tool_error(scenario, exc)
            self.keep_tool_error(scenario, exc)
            return False
        self.maybe_status()
        if filed is not None and self.config.stop_on_first and not filed.flaky and not filed.pre_existing:
            self.status(final=True)
            sys.stdout.flush()
            os._exit(1)
        if filed is not None and self.config.crash_on_new and not filed.flaky and not filed.pre_existing:
            sys.stdout.flush()
            raise NewFinding(f"{filed.violation.signature}: {filed.violation.message} (reproduced {filed.repro_rate}; "
                             f"filed as {filed.path}; replay the crashing input with `mambafuzz repro --raw FILE "
                             f"--split {self.config.split}`)")
        return filed is not None

    def _keep(self, scenario: Scenario) -> Path:
        """Keep an input mambafuzz failed on for a person: beside the findings, never as one."""
        text = scenario.dumps()
        path = Path(self.config.findings) / "tool-errors" / content_name(text, ".json")
        atomic_write(path, text)
        return path

    def keep_tool_error(self, scenario: Scenario, exc: ToolError) -> None:
        """mambafuzz itself failed on this input: keep it, count it, say so in a `tool_error`
        event, and go on with the next input (a buggy vLLM must not end the campaign; libFuzzer's
        -fork mode likewise goes on after a crash)."""
        self.tool_errors += 1
        emit("tool_error", message=f"{exc} (input kept: {self._keep(scenario)})")
        self.maybe_status()

    def stop_on_tool_error(self, scenario: Scenario, exc: ToolError) -> NoReturn:
        """mambafuzz cannot run on this vLLM at all: keep the input, say so in an `error` event,
        and end the worker with exit 3."""
        emit("error", message=f"{exc} (input kept: {self._keep(scenario)})")
        self.status(final=True)
        sys.stdout.flush()
        os._exit(EXIT_TOOL)

    def report_finding(self, filed: Filed) -> None:
        emit("finding", **filed.violation.to_json(), path=str(filed.path), flaky=filed.flaky,
             pre_existing=filed.pre_existing, **({"replaces": True} if filed.replaces else {}),
             reproduced=filed.repro_rate, requests=filed.size[0], tokens=filed.size[2],
             minimize_seconds=round(filed.minimize_seconds, 2),
             seconds=round(time.monotonic() - self.started, 2))

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

    def status(self, final: bool = False, **extra) -> None:
        """A `progress` event, or the `done` event when `final`."""
        emit("done" if final else "progress", execs=self.execs, rejected=self.rejected,
             findings=len(self.triage.filed), dups=self.triage.duplicates, modes=self.modes, tool_errors=self.tool_errors,
             seconds=round(time.monotonic() - self.started, 1), rss_mb=round(current_rss_mb()),
             **({"row_classes": self.row_classes.to_json()} if self.row_classes is not None else {}),
             **self.feedback, **extra)


def current_rss_mb() -> float:
    """Resident set size now (not the peak), from /proc."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (OSError, ValueError, IndexError):
        return 0.0
