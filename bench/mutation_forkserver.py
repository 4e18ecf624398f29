"""The search side of the mutation run's fork server (`bench/mutation_run.py --fork-server`):
what the parent imports before forking, and what a campaign child runs, a random worker under
the WorkerConfig `mambafuzz fuzz` would give it. The fork server itself (forking, time-outs, the
confirmation child, rows) is mambafuzz/tools/mutation/fork_server.py, which says what differs from
a subprocess campaign; these parts drive the search layer, above tools, so they stay here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from mambafuzz.tools.mutation import fork_server

ROOT = Path(__file__).resolve().parent.parent


def warm() -> None:
    """Import what a random worker imports before its first input (vLLM among it); plant nothing."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from mambafuzz.tools.mutation import planting

    if os.environ.get(planting.MUTANT_ENV):
        raise SystemExit(f"mutation_run: {planting.MUTANT_ENV} is set in the fork server's own environment")
    import mambafuzz.checks.pipeline  # noqa: F401  (the scheduler, the harness, vLLM)
    import mambafuzz.model.generate  # noqa: F401
    import mambafuzz.model.inputs  # noqa: F401
    import mambafuzz.search.random_worker  # noqa: F401
    import mambafuzz.search.target_runtime  # noqa: F401
    import mambafuzz.sim.engine.connector  # noqa: F401  (vLLM imports it by module path, in the child otherwise)
    import mambafuzz.store.corpus  # noqa: F401
    import mambafuzz.tools.mutation.kills  # noqa: F401
    import mambafuzz.tools.mutation.planted  # noqa: F401


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


def _campaign_body(mutant_id: str, config_path: Path) -> Callable[[], int]:
    def body() -> int:
        from mambafuzz.search import random_worker
        from mambafuzz.search.worker_protocol import CONFIG_ENV
        from mambafuzz.tools.mutation.planting import MUTANT_ENV

        os.environ[MUTANT_ENV] = mutant_id
        os.environ[CONFIG_ENV] = str(config_path)
        return random_worker.main()
    return body


def run(mutant_ids: Iterable[str], *, max_time: float, minimize_budget: float, known: list[str],
        keep: str | None, parallel: int, hidden: Callable[[object, str], bool | None]) -> Iterator[tuple[str, dict]]:
    """`fork_server.run` with random-worker campaigns of `mambafuzz fuzz --known KNOWN`."""
    def campaign(mutant_id: str, tmp: Path) -> Callable[[], int]:
        config = worker_config(tmp, known, max_time, minimize_budget).write(tmp / "config.json")
        return _campaign_body(mutant_id, config)
    return fork_server.run(mutant_ids, campaign=campaign, max_time=max_time, minimize_budget=minimize_budget,
                           keep=keep, parallel=parallel, hidden=hidden)
