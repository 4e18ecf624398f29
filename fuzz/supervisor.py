"""`mambafuzz fuzz`: start the engine's worker processes, merge their output into one status
line every few seconds, forward Ctrl-C, and end with a summary of what was filed.

Workers: the atheris target (`fuzz/targets/fuzz_scheduler.py`, libFuzzer flags pass through)
for the atheris and hypothesis engines, and `python -m fuzz.random_worker` for the random
engine; one process per job either way.  --jobs N starts N libFuzzer processes on one shared
corpus directory, each with its own -seed, as libFuzzer's own -jobs/-workers mode does (each
re-reads the directory for the others' new inputs, -reload).  Not -fork=N: fork mode starts a
fresh Python process for every short job, and each start re-imports and re-instruments vLLM
(~15 s), so a -fork=2 campaign ran about one input per second and printed its progress in a
format of its own.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fuzz.corpus import atomic_write

TARGET = Path(__file__).parent / "targets" / "fuzz_scheduler.py"
STATUS_EVERY = 5.0
STOP_GRACE = 5.0  # seconds a job gets to stop on SIGINT before SIGTERM
LIBFUZZER_LINE = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
STAT_LINE = re.compile(r"^@@stat pid=(\d+) execs=(\d+) rejected=(\d+) findings=(\d+) dups=(\d+)"
                       r"(?: seconds=[\d.]+ rss_mb=(\d+))?")
RSS_LINE = re.compile(r"rss: (\d+)Mb")


@dataclass
class CampaignConfig:
    engine: str
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


def _child_env(cfg: CampaignConfig) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "MAMBAFUZZ_SPLIT": cfg.split,
        "MAMBAFUZZ_FINDINGS": str(cfg.findings),
        "MAMBAFUZZ_DECODER": "hypothesis" if cfg.engine == "hypothesis" else "bytes",
        "MAMBAFUZZ_ENGINE": cfg.engine,
        "MAMBAFUZZ_STOP_ON_FIRST": "1" if cfg.stop_on_first else "0",
        "MAMBAFUZZ_MINIMIZE_BUDGET": str(cfg.minimize_budget),
        "MAMBAFUZZ_KNOWN": os.pathsep.join(str(d) for d in cfg.known_dirs),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    })
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _commands(cfg: CampaignConfig) -> list[list[str]]:
    if cfg.engine == "random":
        cmds = []
        for job in range(cfg.jobs):
            cmd = [sys.executable, "-m", "fuzz.random_worker", "--seed", str(cfg.seed + job)]
            if cfg.max_time:
                cmd += ["--max-time", str(cfg.max_time)]
            if cfg.runs:
                cmd += ["--runs", str(max(1, cfg.runs // cfg.jobs))]
            if cfg.rss_limit_mb:
                cmd += ["--rss-limit-mb", str(cfg.rss_limit_mb)]
            # Only the first job replays the corpus; the others start generating at once.
            cmds.append(cmd + ([str(d) for d in [cfg.corpus, *cfg.seed_dirs]] if job == 0 else []))
        return cmds
    cmds = []
    for job in range(cfg.jobs):
        cmd = [str(TARGET), str(cfg.corpus), *[str(d) for d in cfg.seed_dirs if d.exists()],
               f"-seed={cfg.seed + job}", "-max_len=4096", f"-rss_limit_mb={cfg.rss_limit_mb or 4096}",
               f"-artifact_prefix={cfg.findings}/libfuzzer-",  # slow/oom/crash units stay out of the CWD
               "-print_final_stats=1"]
        if cfg.max_time:
            cmd.append(f"-max_total_time={int(max(1, cfg.max_time))}")
        if cfg.runs:
            cmd.append(f"-runs={max(1, cfg.runs // cfg.jobs)}")
        cmds.append(cmd + cfg.libfuzzer_args)
    return cmds


def _signal_running(procs: list[subprocess.Popen], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)


def _die_with_parent() -> None:
    try:  # Linux: children get SIGTERM if the supervisor is killed outright
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)
    except Exception:
        pass


def _existing(findings: Path) -> set[Path]:
    return {p for p in findings.glob("*.json")} if findings.exists() else set()


def run_campaign(cfg: CampaignConfig, out=sys.stdout) -> CampaignResult:
    cfg.findings.mkdir(parents=True, exist_ok=True)
    cfg.corpus.mkdir(parents=True, exist_ok=True)
    before = _existing(cfg.findings)
    env = _child_env(cfg)
    start = time.monotonic()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                              cwd=os.getcwd(), preexec_fn=_die_with_parent) for cmd in _commands(cfg)]
    sel = selectors.DefaultSelector()
    for p in procs:
        os.set_blocking(p.stdout.fileno(), False)
        sel.register(p.stdout, selectors.EVENT_READ, p)
    buffers: dict[int, bytes] = {p.pid: b"" for p in procs}
    worker_stats: dict[str, tuple[int, int, int, int]] = {}
    libfuzzer: dict[int, tuple[int, int, int]] = {}  # per process: the last (execs, cov, corpus) it printed
    lf_rss = [0]
    first_finding = None
    tail: list[str] = []
    interrupted = False
    stopping: float | None = None  # when --stop-on-first began stopping the other jobs
    last_status = start

    def totals() -> tuple[int, int | None, int | None]:
        """(executions, coverage, corpus size).  Executions: the workers' own counts or
        libFuzzer's, summed over the processes, whichever is ahead.  Coverage and corpus size:
        those of the furthest libFuzzer process (they share one corpus directory, so their
        sets overlap); None for the random engine."""
        execs = sum(s[0] for s in worker_stats.values())
        if not libfuzzer:
            return execs, None, None
        rows = libfuzzer.values()
        return max(execs, sum(r[0] for r in rows)), max(r[1] for r in rows), max(r[2] for r in rows)

    def handle(line: str, pid: int) -> None:
        nonlocal first_finding
        if m := LIBFUZZER_LINE.match(line):
            libfuzzer[pid] = (int(m[1]), int(m[2]), int(m[4]))
            if r := RSS_LINE.search(line):
                lf_rss[0] = max(lf_rss[0], int(r[1]))
        elif m := STAT_LINE.match(line):
            worker_stats[m[1]] = (int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6] or 0))
        elif line.startswith(("FOUND ", "FLAKY ")):
            if first_finding is None and line.startswith("FOUND "):
                first_finding = time.monotonic() - start
            print(f"[{time.monotonic() - start:6.1f}s] {line}", file=out, flush=True)
        elif line.startswith("@@rss-limit"):
            print(f"[{time.monotonic() - start:6.1f}s] worker stopped: {line[2:]}", file=out, flush=True)
        if line and not line.startswith("@@"):
            tail.append(line)
            del tail[:-40]

    stats_rows: list[str] = []
    if cfg.stats_file is not None and cfg.stats_file.exists():
        stats_rows = cfg.stats_file.read_text().splitlines()[1:]
    offset = float(stats_rows[-1].split(",")[0]) if stats_rows else 0.0

    def status() -> None:
        execs, cov, corp = totals()
        elapsed = max(time.monotonic() - start, 1e-9)
        found = len(_existing(cfg.findings) - before)
        dups = sum(s[3] for s in worker_stats.values())
        rss = max([s[4] for s in worker_stats.values()] + lf_rss)
        if cfg.stats_file is not None:
            stats_rows.append(f"{offset + elapsed:.1f},{execs},{cov if cov is not None else ''},"
                              f"{corp if corp is not None else ''},{found},{rss}")
            atomic_write(cfg.stats_file, "seconds,execs,coverage,corpus,findings,rss_mb\n"
                         + "\n".join(stats_rows) + "\n")
        if cfg.quiet:
            return
        print(f"[{elapsed:6.1f}s] execs {execs} ({execs / elapsed:.0f}/s)  cov {cov if cov is not None else '-'}  "
              f"corpus {corp if corp is not None else '-'}  findings {found} (dup hits {dups})  rss {rss}MB",
              file=out, flush=True)

    try:
        while any(p.poll() is None for p in procs) or sel.get_map():
            for key, _ in sel.select(timeout=0.5):
                p = key.data
                try:
                    chunk = os.read(key.fileobj.fileno(), 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buffers[p.pid] += chunk
                *lines, buffers[p.pid] = buffers[p.pid].split(b"\n")
                for raw in lines:
                    handle(raw.decode(errors="replace").rstrip(), p.pid)
            if cfg.stop_on_first and first_finding is not None:
                # The finder has exited; the other jobs stop as on Ctrl-C, or by SIGTERM once
                # STOP_GRACE has passed (a worker started with SIGINT ignored, as a shell without
                # job control starts background jobs, never sees the SIGINT).
                if stopping is None:
                    stopping = time.monotonic()
                    _signal_running(procs, signal.SIGINT)
                elif time.monotonic() - stopping > STOP_GRACE:
                    _signal_running(procs, signal.SIGTERM)
            if time.monotonic() - last_status >= STATUS_EVERY:
                last_status = time.monotonic()
                status()
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping workers", file=out, flush=True)
        _signal_running(procs, signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
    for p in procs:
        p.wait()
    status()
    execs, cov, corp = totals()
    new_files = sorted(_existing(cfg.findings) - before)
    return CampaignResult(new_files, execs, time.monotonic() - start, cov, corp, interrupted,
                          [p.returncode for p in procs], first_finding, tail)


def finding_meta(path: Path) -> dict:
    try:
        return json.loads(path.read_text()).get("finding", {})
    except (OSError, ValueError):
        return {}
