"""A fork server for the mutation run (`bench/mutation_run.py --fork-server`).

A subprocess campaign (`python -m mambafuzz.cli fuzz ...`) spends about 15 s before its first
input: two interpreters import vLLM (the supervisor and its worker). Over the 1,253 mutants of
the whole target set that start-up alone is about five hours of one core. AFL's fork server
answers the same cost: start the target once, stop it just before it reads input, and fork a
child per run.

Here the parent imports the random worker and everything it imports (vLLM included), plants
nothing, and runs no scenario. Each campaign is a forked child that runs the random worker's own
entry point (`mambafuzz.search.random_worker.main`) under the WorkerConfig `mambafuzz fuzz`
would give it (`supervisor.worker_config`, `generators.own_loop`'s fields) and with
`MAMBAFUZZ_MUTANT` set, so the worker's start-up step plants the mutant exactly as a fuzz worker
does. The confirmation (`mutants.confirms_kill`: fails with the mutant, clean without it) runs in
a second child forked from the same clean parent, so no campaign's planted code or warmed cache
reaches another.

What differs from a subprocess campaign, and is said wherever its figures are quoted:
- the time box is fuzzing time: `--max-time` of `mambafuzz fuzz` also covers its worker's import
  of vLLM (about 7 s on this machine), a fork-server child gets all of it for inputs;
- there is no supervisor process: the worker files and minimizes its finding itself, as it
  always does, and nothing else the supervisor does changes a kill (it relays events);
- only generators that run their own loop (`random`): libFuzzer re-executes its target, which a
  fork cannot stand in for.

All forking is done from the main thread of a single-threaded parent.

Do not change the checkout while a run goes on. The children inherit the modules the parent
imported, but one they import later comes from disk, so an edit mixes versions. vLLM loads the
simulated connector by module path, for example, and so `warm` imports it too. A run during this
project's merges let mutants survive that a clean run kills within a second (docs/MUTATION.md).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def warm() -> None:
    """Import what a random worker imports before its first input (vLLM among it); plant nothing."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from mambafuzz.search import startup

    if os.environ.get(startup.MUTANT_ENV):
        raise SystemExit(f"mutation_run: {startup.MUTANT_ENV} is set in the fork server's own environment")
    import mambafuzz.checks.pipeline  # noqa: F401  (the scheduler, the harness, vLLM)
    import mambafuzz.model.generate  # noqa: F401
    import mambafuzz.model.inputs  # noqa: F401
    import mambafuzz.search.mutants  # noqa: F401
    import mambafuzz.search.random_worker  # noqa: F401
    import mambafuzz.search.target_runtime  # noqa: F401
    import mambafuzz.sim.engine.connector  # noqa: F401  (vLLM imports it by module path, in the child otherwise)
    import mambafuzz.store.corpus  # noqa: F401


def worker_config(tmp: Path, known: list[str], max_time: float, minimize_budget: float, seed: int = 1):
    """The WorkerConfig of job 0 of `mambafuzz fuzz --split fixed --generator random --max-time S
    --stop-on-first --seeds --known KNOWN --corpus TMP/corpus --findings TMP/findings`."""
    from mambafuzz.search import supervisor
    from mambafuzz.search.worker_protocol import CampaignConfig

    cfg = CampaignConfig(generator="random", split="fixed", max_time=max_time, runs=0, jobs=1, seed=seed,
                         corpus=tmp / "corpus", seed_dirs=[], findings=tmp / "findings",
                         known_dirs=[ROOT / d for d in known], stop_on_first=True, minimize_budget=minimize_budget,
                         rss_limit_mb=4096)
    config = supervisor.worker_config(cfg, 0)
    config.seed, config.max_time, config.rss_limit_mb = seed, max_time, cfg.rss_limit_mb
    config.replay_dirs = [str(cfg.corpus)]
    (tmp / "corpus").mkdir(parents=True, exist_ok=True)
    return config


def _fork(body: Callable[[], int], log: Path) -> int:
    """Run `body` in a forked child whose stdout and stderr go to `log`; returns its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    rc = 3
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        rc = body()
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 3
    except BaseException:  # noqa: BLE001 - the child must never return into the parent's loop
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def _campaign_body(mutant_id: str, config_path: Path) -> Callable[[], int]:
    def body() -> int:
        from mambafuzz.search import random_worker, startup
        from mambafuzz.search.worker_protocol import CONFIG_ENV

        os.environ[startup.MUTANT_ENV] = mutant_id
        os.environ[CONFIG_ENV] = str(config_path)
        return random_worker.main()
    return body


def _confirm_body(mutant_id: str, finding: Path, signature: str, out: Path,
                  hidden: Callable[[object, str], bool | None]) -> Callable[[], int]:
    def body() -> int:
        from mambafuzz.search.mutants import confirms_kill
        from mambafuzz.store.corpus import load_case

        case = load_case(finding)
        ok, why = confirms_kill(case.scenario, "fixed", mutant_id, signature)
        out.write_text(json.dumps({"killed": ok, "why": why,
                                   "hidden_by_known_fixes": hidden(case.scenario, mutant_id) if ok else None}))
        return 0
    return body


@dataclass
class _Job:
    mutant_id: str
    tmp: tempfile.TemporaryDirectory
    started: float
    deadline: float
    phase: str = "campaign"  # then "confirm"
    row: dict = field(default_factory=lambda: {"killed": False})

    @property
    def dir(self) -> Path:
        return Path(self.tmp.name)


def run(mutant_ids: Iterable[str], *, max_time: float, minimize_budget: float, known: list[str],
        keep: str | None, parallel: int, hidden: Callable[[object, str], bool | None]) -> Iterator[tuple[str, dict]]:
    """Yield (mutant id, row) as each campaign (and its confirmation) ends, at most `parallel`
    children at a time. Rows have the keys of bench/mutation_run.py's subprocess campaigns."""
    todo = list(mutant_ids)
    running: dict[int, _Job] = {}
    # A terminated parent (a CI time-out) stops its children too: SIGTERM ends the loop below as
    # Ctrl-C does, and its `finally` kills what still runs.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    slack = minimize_budget + 120  # start-up of the child, minimizing, filing

    def start_campaign(mutant_id: str) -> None:
        job = _Job(mutant_id, tempfile.TemporaryDirectory(prefix="mforks-"), time.monotonic(), 0.0)
        config = worker_config(job.dir, known, max_time, minimize_budget).write(job.dir / "config.json")
        job.deadline = job.started + max_time + slack
        running[_fork(_campaign_body(mutant_id, config), job.dir / "worker.log")] = job

    def finish_campaign(job: _Job, rc: int) -> _Job | None:
        """The campaign's row, or the job again when its finding still needs confirming."""
        job.row["wall"] = round(time.monotonic() - job.started, 1)
        if rc == 3:
            lines = (job.dir / "worker.log").read_text(errors="replace").strip().splitlines()
            job.row.update(status="tool-error", why=(lines or [""])[-1][:300])
            return None
        files = sorted((job.dir / "findings").glob("*.json"))
        if rc != 1 or not files:
            job.row["status"] = "survived"
            return None
        meta = json.loads(files[0].read_text())["finding"]
        job.row.update(signature=meta["signature"], seconds=meta["origin"].get("seconds"),
                       execs=meta["origin"].get("execs"))
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            kept = Path(keep) / (job.mutant_id.replace(":", "_") + ".json")
            kept.write_text(files[0].read_text())
            job.row["finding"] = str(kept)
        job.phase = "confirm"
        job.deadline = time.monotonic() + 600
        body = _confirm_body(job.mutant_id, files[0], meta["signature"], job.dir / "confirm.json", hidden)
        running[_fork(body, job.dir / "confirm.log")] = job
        return job

    def finish_confirm(job: _Job, rc: int) -> None:
        result = job.dir / "confirm.json"
        if rc != 0 or not result.exists():
            job.row.update(status="tool-error", why="the confirmation replay failed: "
                           + (job.dir / "confirm.log").read_text(errors="replace")[-300:])
            return
        verdict = json.loads(result.read_text())
        job.row.update(verdict, status="killed" if verdict["killed"] else "unconfirmed")

    try:
        while todo or running:
            while todo and len(running) < parallel:
                start_campaign(todo.pop(0))
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                now = time.monotonic()
                for p, job in list(running.items()):
                    if now > job.deadline:
                        os.kill(p, signal.SIGKILL)  # reaped below as a signal death: a tool error
                time.sleep(0.1)
                continue
            job = running.pop(pid, None)
            if job is None:
                continue
            rc = os.waitstatus_to_exitcode(status)
            if rc < 0:
                job.row.update(status="tool-error", wall=round(time.monotonic() - job.started, 1),
                               why=f"the {job.phase} child died of signal {-rc}")
            elif job.phase == "campaign":
                if finish_campaign(job, rc) is not None:
                    continue
            else:
                finish_confirm(job, rc)
            yield job.mutant_id, job.row
            job.tmp.cleanup()
    finally:
        for p in running:
            try:
                os.kill(p, signal.SIGKILL)
                os.waitpid(p, 0)
            except OSError:
                pass
        for job in running.values():
            job.tmp.cleanup()
