"""`mambafuzz fuzz`: start the generator's worker processes, merge their events into one status
line every few seconds, forward Ctrl-C, and end with what was filed and whether the campaign
really ran.

Workers: whatever the generator's entry in mambafuzz.search.generators starts (the atheris target
`mambafuzz/search/targets/fuzz_scheduler.py` under libFuzzer, libFuzzer flags passed through, for the
atheris and hypothesis generators; `python -m mambafuzz.search.random_worker` for the random one); one
process per job.  Every worker runs under this process's own interpreter
(`sys.executable`), never a `python3` found on PATH: a target started through its
`#!/usr/bin/env python3` line ran under whatever interpreter came first, one without vLLM
fuzzed nothing, and the campaign passed.  libFuzzer re-runs its argv[0] for -fork/-merge, so
that argv[0] is a small launcher script that execs this interpreter on the target.

--jobs N starts N libFuzzer processes on one shared corpus directory, each with its own -seed,
as libFuzzer's own -jobs/-workers mode does (each re-reads the directory for the others' new
inputs).  Not -fork=N: fork mode starts a fresh Python process for every short job, and each
start re-imports and re-instruments vLLM.

Workers are configured by one WorkerConfig file and report in JSON events
(mambafuzz.search.worker_protocol).  A campaign in which no worker started, or which executed no input,
is a failure (`CampaignResult.problems`), never a clean pass.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from mambafuzz.findings import Violation
from mambafuzz.search import fuzz_targets, generators
from mambafuzz.search.generators import Launch
from mambafuzz.search.worker_protocol import CONFIG_ENV, CampaignConfig, WorkerConfig, parse_event
from mambafuzz.store import explanations
from mambafuzz.store.corpus import atomic_write

STATUS_EVERY = 5.0
STOP_GRACE = 5.0  # seconds a job gets to stop on SIGINT before SIGTERM
# libFuzzer's own status line: read only for its coverage and corpus counters, which no worker knows.
LIBFUZZER_LINE = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
RSS_LINE = re.compile(r"rss: (\d+)Mb")
# How a worker may end without anything being wrong: cleanly, after filing with --stop-on-first,
# or stopped by us (SIGINT, or SIGTERM after the grace period).
NORMAL_EXITS = (0, 1, -signal.SIGINT, 130, -signal.SIGTERM)


@dataclass
class CampaignResult:
    new_files: list[Path]
    execs: int
    seconds: float
    coverage: int | None
    corpus_size: int | None
    interrupted: bool
    exit_codes: list[int]
    first_finding_seconds: float | None
    log_tail: list[str]
    problems: list[str] = field(default_factory=list)  # why the campaign cannot count as having run
    tool_errors: int = 0  # inputs mambafuzz itself failed on; the campaign went on past each
    pre_existing: list[Path] = field(default_factory=list)  # PR mode: findings its base shows too
    modes: dict[str, int] = field(default_factory=dict)  # executions per scheduling mode (the workers' own counts)
    row_classes: dict[str, dict[str, int]] = field(default_factory=dict)  # conform: inputs reaching each row class, per runner


def worker_config(cfg: CampaignConfig, job: int, deadline: float = 0.0) -> WorkerConfig:
    """What every generator's worker of job `job` is told; the generator's `launch` adds its own."""
    return WorkerConfig(target=cfg.target, split=cfg.split, findings=str(cfg.findings), generator=cfg.generator,
                        stop_on_first=cfg.stop_on_first, minimize_budget=cfg.minimize_budget,
                        known_dirs=[str(d) for d in cfg.known_dirs], patches=list(cfg.patches),
                        known_fix_dirs=list(cfg.known_fix_dirs), runner=cfg.runner, deadline=deadline,
                        untriaged_dirs=[str(d) for d in cfg.untriaged_dirs],
                        conform_kernels=fuzz_targets.get(cfg.target).conform_kernels,
                        scheduling=cfg.scheduling, base=cfg.base, efficiency_allowed=list(cfg.efficiency_allowed))


def launches(cfg: CampaignConfig, workdir: Path) -> list[Launch]:
    """One worker process per job, started as the campaign's generator (mambafuzz.search.generators) says."""
    deadline = time.time() + cfg.max_time if cfg.max_time else 0.0  # the whole campaign's end
    return generators.get(cfg.generator).launch(cfg, workdir, [worker_config(cfg, job, deadline)
                                                               for job in range(cfg.jobs)])


def _env(config_path: Path) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env[CONFIG_ENV] = str(config_path)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _signal_running(procs: list[subprocess.Popen], sig: int, stopped: set[int]) -> None:
    """Signal the live workers, remembering which were stopped by us (their exit code is then
    whatever their runtime uses for an interrupt, e.g. libFuzzer's 72)."""
    for p in procs:
        if p.poll() is None:
            stopped.add(p.pid)
            p.send_signal(sig)


def _die_with_parent() -> None:
    try:  # Linux: children get SIGTERM if the supervisor is killed outright
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)
    except Exception:
        pass


@dataclass
class _Worker:
    """What the supervisor knows of one worker: only what its events and exit said."""

    proc: subprocess.Popen
    started: bool = False
    progress: dict = field(default_factory=dict)  # its last progress/done event
    error: str | None = None
    libfuzzer: tuple[int, int, int] | None = None  # last (execs, cov, corpus) libFuzzer printed
    tail: list[str] = field(default_factory=list)
    buffer: bytes = b""


class Campaign:
    """The state of one running campaign, updated line by line from the workers' output."""

    def __init__(self, cfg: CampaignConfig, out: TextIO):
        self.cfg = cfg
        self.out = out
        self.start = time.monotonic()
        self.workers: dict[int, _Worker] = {}
        self.filed: list[dict] = []  # finding events, in arrival order
        self.tool_errors: list[str] = []  # tool_error events' messages: inputs mambafuzz failed on
        self.pre_existing: list[dict] = []  # PR mode: finding events the base shows too (never new)
        self.first_finding: float | None = None
        self.lf_rss = 0
        self.stopped: set[int] = set()  # pids we signalled to stop
        self.stats_rows: list[str] = []
        if cfg.stats_file is not None and cfg.stats_file.exists():
            self.stats_rows = cfg.stats_file.read_text().splitlines()[1:]
        self.stats_offset = float(self.stats_rows[-1].split(",")[0]) if self.stats_rows else 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def say(self, text: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {text}", file=self.out, flush=True)

    def handle(self, w: _Worker, line: str) -> None:
        event = parse_event(line)
        if event is None:
            if m := LIBFUZZER_LINE.match(line):
                w.libfuzzer = (int(m[1]), int(m[2]), int(m[4]))
                if r := RSS_LINE.search(line):
                    self.lf_rss = max(self.lf_rss, int(r[1]))
            if line:
                w.tail.append(line)
                del w.tail[:-40]
            return
        kind = event["event"]
        if kind == "started":
            w.started = True
        elif kind in ("progress", "done"):
            w.progress = event
            if event.get("stopped") and event["stopped"] != "interrupted":
                self.say(f"worker {w.proc.pid} stopped: {event['stopped']}")
        elif kind == "error":
            w.error = str(event.get("message", "?"))
            self.say(f"worker {w.proc.pid} cannot run: {w.error}")
        elif kind == "tool_error":
            self.tool_errors.append(str(event.get("message", "?")))
            self.say(f"TOOL FAILURE (worker {w.proc.pid} goes on): {self.tool_errors[-1]}")
        elif kind == "finding" and event.get("pre_existing"):
            self.pre_existing.append(event)
            self.say(f"PRE-EXISTING {Violation.from_json(event).signature} (the base shows it too) -> {event.get('path')}"
                     + _label_suffix(event))
        elif kind == "finding":
            if event.get("replaces"):  # a larger gap, saved over the case filed at the same path
                self.filed = [e for e in self.filed if e.get("path") != event.get("path")]
            self.filed.append(event)
            if self.first_finding is None and not event.get("flaky"):
                self.first_finding = self.elapsed()
            tag = "FLAKY" if event.get("flaky") else "LARGER GAP" if event.get("replaces") else "FOUND"
            self.say(f"{tag} {Violation.from_json(event).signature} reproduced {event.get('reproduced')} -> {event.get('path')} "
                     f"(minimized to {event.get('requests')} requests, {event.get('tokens')} tokens in "
                     f"{event.get('minimize_seconds')}s)" + _label_suffix(event))

    def totals(self) -> tuple[int, int | None, int | None]:
        """(executions, coverage, corpus size).  Executions: the workers' own counts or
        libFuzzer's, summed over the processes, whichever is ahead.  Coverage and corpus size:
        those of the furthest libFuzzer process (they share one corpus directory, so their sets
        overlap), or of a worker that reports its own (`pairs`: state-coverage features and kept
        inputs); None for the random generator."""
        execs = sum(int(w.progress.get("execs", 0)) for w in self.workers.values())
        rows = [w.libfuzzer for w in self.workers.values() if w.libfuzzer]
        if not rows:
            own = [w.progress for w in self.workers.values() if "cov" in w.progress]
            if own:
                return execs, max(int(p["cov"]) for p in own), max(int(p["corpus"]) for p in own)
            return execs, None, None
        return max(execs, sum(r[0] for r in rows)), max(r[1] for r in rows), max(r[2] for r in rows)

    def status(self) -> None:
        execs, cov, corp = self.totals()
        elapsed = max(self.elapsed(), 1e-9)
        found = sum(not e.get("flaky") for e in self.filed)
        dups = sum(int(w.progress.get("dups", 0)) for w in self.workers.values())
        rss = max([int(w.progress.get("rss_mb", 0)) for w in self.workers.values()] + [self.lf_rss])
        if self.cfg.stats_file is not None:
            self.stats_rows.append(f"{self.stats_offset + elapsed:.1f},{execs},{cov if cov is not None else ''},"
                                   f"{corp if corp is not None else ''},{found},{rss}")
            atomic_write(self.cfg.stats_file, "seconds,execs,coverage,corpus,findings,rss_mb\n"
                         + "\n".join(self.stats_rows) + "\n")
        if self.cfg.quiet:
            return
        tool = f"  tool failures {len(self.tool_errors)}" if self.tool_errors else ""
        classes = self.row_classes()
        tool += f"  row classes {classes.line()}" if classes.inputs else ""
        print(f"[{elapsed:6.1f}s] execs {execs} ({execs / elapsed:.0f}/s)  cov {cov if cov is not None else '-'}  "
              f"corpus {corp if corp is not None else '-'}  findings {found} (dup hits {dups}){tool}  rss {rss}MB",
              file=self.out, flush=True)

    def row_classes(self):
        """The conform target's row classes, summed over the workers' last reports."""
        from mambafuzz.conform.row_classes import ClassCoverage

        return ClassCoverage.merged(w.progress.get("row_classes") for w in self.workers.values())

    def problems(self, interrupted: bool) -> list[str]:
        """Why this campaign does not count as having fuzzed: workers that never started, said
        they cannot run, or died; and no input executed at all."""
        out = []
        for w in self.workers.values():
            code = w.proc.returncode
            last = w.tail[-1] if w.tail else "no output"
            if w.error:
                out.append(f"worker {w.proc.pid} cannot run: {w.error}")
            elif not w.started and not interrupted:
                out.append(f"worker {w.proc.pid} exited {code} before it started: {last}")
            elif code not in NORMAL_EXITS and w.proc.pid not in self.stopped and not interrupted:
                out.append(f"worker {w.proc.pid} died (exit {code}): {last}")
        if self.tool_errors:
            out.append(f"{len(self.tool_errors)} tool failure(s) on single inputs, each kept under "
                       f"{self.cfg.findings}/tool-errors/ (the campaign went on); first: {self.tool_errors[0]}")
        if not interrupted and self.totals()[0] == 0:
            out.append("the campaign executed no input")
        return out


def _read_ready(sel: selectors.BaseSelector, campaign: Campaign) -> None:
    for key, _ in sel.select(timeout=0.5):
        w: _Worker = key.data
        try:
            chunk = os.read(key.fileobj.fileno(), 65536)
        except BlockingIOError:
            continue
        if not chunk:
            sel.unregister(key.fileobj)
            continue
        w.buffer += chunk
        *lines, w.buffer = w.buffer.split(b"\n")
        for raw in lines:
            campaign.handle(w, raw.decode(errors="replace").rstrip())


def run_campaign(cfg: CampaignConfig, out: TextIO = sys.stdout) -> CampaignResult:
    cfg.findings.mkdir(parents=True, exist_ok=True)
    cfg.corpus.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="mambafuzz-campaign-"))
    try:
        return _run(cfg, out, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run(cfg: CampaignConfig, out: TextIO, workdir: Path) -> CampaignResult:
    campaign = Campaign(cfg, out)
    sel = selectors.DefaultSelector()
    for i, launch in enumerate(launches(cfg, workdir)):
        config_path = launch.config.write(workdir / f"worker-{i}.json")
        proc = subprocess.Popen(launch.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=_env(config_path), cwd=os.getcwd(), preexec_fn=_die_with_parent)
        w = _Worker(proc)
        campaign.workers[proc.pid] = w
        os.set_blocking(proc.stdout.fileno(), False)
        sel.register(proc.stdout, selectors.EVENT_READ, w)
    procs = [w.proc for w in campaign.workers.values()]
    interrupted = False
    stopping: float | None = None  # when --stop-on-first began stopping the other jobs
    last_status = campaign.start
    try:
        while any(p.poll() is None for p in procs) or sel.get_map():
            _read_ready(sel, campaign)
            if cfg.stop_on_first and campaign.first_finding is not None:
                # The other jobs stop as on Ctrl-C, or by SIGTERM once STOP_GRACE has passed (a
                # worker started with SIGINT ignored, as a shell without job control starts
                # background jobs, never sees the SIGINT).
                if stopping is None:
                    stopping = time.monotonic()
                    _signal_running(procs, signal.SIGINT, campaign.stopped)
                elif time.monotonic() - stopping > STOP_GRACE:
                    _signal_running(procs, signal.SIGTERM, campaign.stopped)
            if time.monotonic() - last_status >= STATUS_EVERY:
                last_status = time.monotonic()
                campaign.status()
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping workers", file=out, flush=True)
        _signal_running(procs, signal.SIGINT, campaign.stopped)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
    for p in procs:
        p.wait()
    campaign.status()
    execs, cov, corp = campaign.totals()
    tail = [line for w in campaign.workers.values() for line in w.tail][-40:]
    modes: dict[str, int] = {}
    for w in campaign.workers.values():
        for mode, n in (w.progress or {}).get("modes", {}).items():
            modes[mode] = modes.get(mode, 0) + int(n)
    return CampaignResult([Path(e["path"]) for e in campaign.filed if e.get("path")], execs, campaign.elapsed(),
                          cov, corp, interrupted, [p.returncode for p in procs], campaign.first_finding, tail,
                          campaign.problems(interrupted), len(campaign.tool_errors),
                          [Path(e["path"]) for e in campaign.pre_existing if e.get("path")], modes,
                          campaign.row_classes().to_json())


def _label_suffix(event: dict) -> str:
    """What explains a filed finding and whether a real engine builds its config, for its console line."""
    if not event.get("path"):
        return ""
    label = explanations.labels(Path(event["path"]))
    explained = label["explained_by"]
    return (f"  [{explained}]" if explained != explanations.NO_EXPLANATION else "") + explanations.tag(label["engine"])


def finding_meta(path: Path) -> dict:
    try:
        return json.loads(path.read_text()).get("finding", {})
    except (OSError, ValueError):
        return {}
