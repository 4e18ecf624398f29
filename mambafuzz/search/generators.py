"""The input generators `mambafuzz fuzz --generator` picks from, registered once by name.

An entry says how its worker processes start (`launch`, which the supervisor calls), how a raw
corpus input it keeps decodes into a scenario (`decoder`, mambafuzz.model.inputs.decode_input),
whether it needs atheris, which fuzz targets (mambafuzz.search.fuzz_targets) it can drive, and one clause for
`--help`.  The CLI's choices and checks, the supervisor, the worker runtime (its decoder) and the benches read
it; an unknown name is a one-line UnknownGenerator.  Two ways of starting workers exist:

- `own_loop(module)`: `python -m module`, one process per job, running its own loop; the
  supervisor's seed (plus the job number), time and run bounds, RSS limit and (first job only)
  the directories to replay go into its WorkerConfig (mambafuzz/search/random_worker.py);
- `libfuzzer`: the atheris target (mambafuzz/search/targets/fuzz_scheduler.py) under libFuzzer,
  the bounds as libFuzzer flags, the flags after `--` passed on.

So a new generator is its worker module plus one line in `GENERATORS`.  Imports nothing heavy:
`--help` reads it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mambafuzz.search.worker_protocol import CampaignConfig, WorkerConfig

TARGET = Path(__file__).parent / "targets" / "fuzz_scheduler.py"


class UnknownGenerator(ValueError):
    """A generator name nothing is registered for (one line)."""


@dataclass
class Launch:
    """One worker process: its argv and its configuration."""

    argv: list[str]
    config: WorkerConfig


# The campaign, a scratch directory that lives as long as it, and each job's WorkerConfig as the
# supervisor filled it in (what every generator's workers share) -> one Launch per job.
LaunchFn = Callable[[CampaignConfig, Path, list[WorkerConfig]], list[Launch]]


@dataclass(frozen=True)
class Generator:
    name: str  # --generator, WorkerConfig.generator, a finding's origin
    description: str  # one clause for --help
    launch: LaunchFn
    decoder: str = "bytes"  # how a raw input it keeps becomes a scenario (mambafuzz.model.inputs.decode_input)
    needs_atheris: bool = False
    targets: tuple[str, ...] | None = None  # the fuzz targets its workers can drive; None: every registered one

    def drives(self, target: str) -> bool:
        return self.targets is None or target in self.targets


def own_loop(module: str) -> LaunchFn:
    """Workers that run `python -m module` and bound and seed their own loop."""

    def launch(cfg: CampaignConfig, workdir: Path, configs: list[WorkerConfig]) -> list[Launch]:
        out = []
        for job, config in enumerate(configs):
            config.seed = cfg.seed + job
            config.max_time = cfg.max_time
            config.runs = max(1, cfg.runs // cfg.jobs) if cfg.runs else 0
            config.rss_limit_mb = cfg.rss_limit_mb
            # Only the first job replays the corpus; the others start generating at once.
            config.replay_dirs = [str(d) for d in [cfg.corpus, *cfg.seed_dirs]] if job == 0 else []
            config.corpus = str(cfg.corpus)
            out.append(Launch([sys.executable, "-m", module], config))
        return out

    return launch


def libfuzzer(cfg: CampaignConfig, workdir: Path, configs: list[WorkerConfig]) -> list[Launch]:
    """libFuzzer workers on one shared corpus directory, each with its own -seed."""
    target = launcher(workdir)
    out = []
    for job, config in enumerate(configs):
        argv = [str(target), str(cfg.corpus), *[str(d) for d in cfg.seed_dirs if d.exists()],
                f"-seed={cfg.seed + job}", "-max_len=4096", f"-rss_limit_mb={cfg.rss_limit_mb or 4096}",
                f"-artifact_prefix={cfg.findings}/libfuzzer-",  # slow/oom/crash units stay out of the CWD
                "-print_final_stats=1"]
        if cfg.max_time:
            argv.append(f"-max_total_time={int(max(1, cfg.max_time))}")
        if cfg.runs:
            argv.append(f"-runs={max(1, cfg.runs // cfg.jobs)}")
        out.append(Launch(argv + cfg.libfuzzer_args, config))
    return out


def launcher(workdir: Path) -> Path:
    """An executable that runs the atheris target under this interpreter; libFuzzer re-runs it
    (argv[0]) for -fork, -merge and -minimize_crash."""
    path = workdir / "fuzz_scheduler"
    path.write_text(f"#!/bin/sh\nexec {_sh_quote(sys.executable)} {_sh_quote(str(TARGET))} \"$@\"\n")
    path.chmod(0o755)
    return path


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


GENERATORS: dict[str, Generator] = {g.name: g for g in (
    Generator("atheris", "libFuzzer mutation with coverage feedback", libfuzzer, needs_atheris=True),
    Generator("hypothesis", "Hypothesis' decoder under the same feedback", libfuzzer, decoder="hypothesis",
              needs_atheris=True),
    Generator("random", "seeded, no feedback", own_loop("mambafuzz.search.random_worker")),
    Generator("pairs", "seeded, keeps and mutates inputs that reach a new pair of knobs and scheduler events "
              "(state coverage)", own_loop("mambafuzz.search.pairs_worker"), targets=("scheduler",)),
)}
DEFAULT = "random"  # the best attributed time to bug in bench/mutation_score.py (README, 'Mutation testing')


def names() -> tuple[str, ...]:
    """Every registered generator's name, in registration order."""
    return tuple(GENERATORS)


def get(name: str) -> Generator:
    """The entry registered as `name`; an unknown name is an UnknownGenerator."""
    try:
        return GENERATORS[name]
    except (KeyError, TypeError):
        raise UnknownGenerator(f"unknown generator {name!r} (one of {', '.join(GENERATORS)})") from None


def decoders() -> dict[str, tuple[str, ...]]:
    """Each decoder a generator keeps inputs for, with the generators that use it (bytes first)."""
    out: dict[str, tuple[str, ...]] = {"bytes": ()}
    for g in GENERATORS.values():
        out[g.decoder] = out.get(g.decoder, ()) + (g.name,)
    return out
