"""The feedback-free generator: the shared input model driven by a seeded PRNG.  Also replays
the corpus first, so seeds and earlier inputs are always re-checked.

Run as `python -m mambafuzz.search.random_worker` with a `WorkerConfig` file named in
MAMBAFUZZ_WORKER_CONFIG (seed, time and run bounds, RSS limit, directories to replay);
`mambafuzz fuzz --generator random` does this.  Reports in `mambafuzz.search.worker_protocol` events.
`serve` is the loop every generator with its own loop shares (mambafuzz.search.pairs_worker too):
start-up, the corpus replay, the bounds, the RSS limit, Ctrl-C and the final `done` event.
"""

from __future__ import annotations

import gc
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from mambafuzz.exit_codes import EXIT_CLEAN, EXIT_TOOL, one_line
from mambafuzz.search import fuzz_targets
from mambafuzz.search.worker_protocol import WorkerConfig, emit

# (its configuration, the runtime) -> an iterator that yields before each input it draws and runs
# (or rejects): `serve` checks the bounds at each yield, as before any input
InputLoop = Callable[[WorkerConfig, "object"], Iterator[None]]


def serve(name: str, inputs: InputLoop) -> int:
    """Start up, replay the corpus, then run `inputs` until the run or time bound, the RSS limit
    or Ctrl-C; the last event says why it stopped."""
    try:
        config = WorkerConfig.from_environment()
        from mambafuzz.model.inputs import decode_input, iter_input_files
        from mambafuzz.search.startup import prepare_worker
        from mambafuzz.search.target_runtime import Runtime, current_rss_mb

        prepare_worker(config)
        runtime = Runtime(config)
    except Exception as exc:  # noqa: BLE001 - said as one event; the supervisor fails the campaign
        emit("error", message=one_line(exc))
        return EXIT_TOOL
    emit("started", generator=name, python=sys.executable)
    gc.freeze()  # vLLM and torch's heap never needs rescanning by full collections
    deadline = time.monotonic() + config.fuzz_seconds(config.max_time) if config.max_time > 0 else None
    stopped = None
    try:
        stats: dict = {}
        for path, data in iter_input_files([Path(c) for c in config.replay_dirs], stats):
            scenario = decode_input(data)
            if scenario is not None:
                runtime.run_scenario(scenario, {"input": str(path)})
        for _ in inputs(config, runtime):
            if (config.runs and runtime.execs >= config.runs) or (deadline is not None and time.monotonic() >= deadline):
                break
            if config.rss_limit_mb and current_rss_mb() > config.rss_limit_mb:
                stopped = f"rss {current_rss_mb():.0f}MB over the {config.rss_limit_mb}MB limit"
                break
    except KeyboardInterrupt:
        stopped = "interrupted"
    runtime.status(final=True, **({"stopped": stopped} if stopped else {}))
    return EXIT_CLEAN


def random_inputs(config: WorkerConfig, runtime) -> Iterator[None]:
    """Scenarios drawn from a PRNG seeded by the job's seed, each with its own case seed."""
    from mambafuzz.model.generate import RandomSource, draw_worker_rows, random_scenario
    from mambafuzz.model.scenario import validate

    rng = random.Random(config.seed)
    draws_worker_rows = fuzz_targets.get(config.target).draws_worker_rows
    while True:
        yield
        case_seed = rng.getrandbits(63)
        case_rng = random.Random(case_seed)
        scenario = random_scenario(case_rng)
        if draws_worker_rows:  # the same seed goes on to draw the worker's row edges
            scenario = draw_worker_rows(RandomSource(case_rng), scenario)
        if validate(scenario):
            runtime.rejected += 1
        else:
            runtime.run_scenario(scenario, {"input": "random", "seed": config.seed, "case_seed": case_seed})


def main() -> int:
    return serve("random", random_inputs)


if __name__ == "__main__":
    sys.exit(main())
