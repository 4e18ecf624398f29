"""The state-coverage generator (`mambafuzz fuzz --generator pairs`): random draws, kept and
mutated when their run reaches a new pair of knobs and scheduler events.

Random draws meet two dimensions together only as often as the product of their shares (a
preemption of a request that had sampled, under spec decoding: 10 in 2,000 executions,
bench/RESULTS.md). This generator keeps every input whose cached run reached a dimension or pair
(mambafuzz.search.state_coverage) no earlier input reached, and mutates the inputs that hold rare
ones (mambafuzz.search.pair_search), as AFLNet keeps inputs that reach a new protocol state. The
pairs are read from the trace of the input's own cached run (harness.RUN_OBSERVERS), not from
vLLM's code coverage, so the feedback is the scheduler's behaviour. Kept inputs are written to the
campaign's corpus as bytes, which every generator's decoder replays. The scheduler target only:
the conform target runs no harness trace.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

from mambafuzz.search.random_worker import serve
from mambafuzz.search.worker_protocol import WorkerConfig


def pair_inputs(config: WorkerConfig, runtime) -> Iterator[None]:
    from mambafuzz.model.generate import scenario_from_bytes
    from mambafuzz.model.scenario import validate
    from mambafuzz.search.pair_search import PairSearch
    from mambafuzz.search.state_coverage import dimensions, features
    from mambafuzz.sim.engine import harness
    from mambafuzz.store.corpus import atomic_write, content_name

    search = PairSearch(random.Random(config.seed))
    reached: list[frozenset] = []

    def observe(scenario, trace) -> None:
        if trace.prefix_caching and not reached:  # the input's own cached run, not triage's re-runs
            reached.append(features(dimensions(scenario, trace)))

    harness.RUN_OBSERVERS.append(observe)
    corpus = Path(config.corpus) if config.corpus else None
    try:
        if corpus is not None and corpus.is_dir():
            _reload(search, corpus, config, reached)
        runtime.feedback = {"cov": len(search.counts), "corpus": len(search.pool)}
        while True:
            yield
            data = search.next_input()
            scenario = scenario_from_bytes(data)
            if validate(scenario):
                runtime.rejected += 1
                continue
            reached.clear()
            runtime.run_scenario(scenario, {"input": "pairs", "seed": config.seed}, data)
            if reached and search.observe(data, reached[0]) and corpus is not None:
                atomic_write(corpus / content_name(data, ""), data)
            runtime.feedback = {"cov": len(search.counts), "corpus": len(search.pool)}
    finally:
        harness.RUN_OBSERVERS.remove(observe)


def _reload(search, corpus: Path, config: WorkerConfig, reached: list) -> None:
    """The byte inputs an earlier campaign kept in `corpus` go back into the search: each is run
    once with prefix caching (no oracle: the replay judges it) for the features it reaches, as
    libFuzzer loads its corpus before mutating. Scenario files are left to the replay."""
    from mambafuzz.model.inputs import decode_input, decode_json_case, iter_input_files
    from mambafuzz.model.scenario import ScenarioError, with_runner, with_scheduling
    from mambafuzz.sim.engine import harness

    for _, data in iter_input_files([corpus], {}, warn=lambda _: None):  # the replay warns about junk
        scenario = decode_input(data) if decode_json_case(data) is None else None  # as the replay decodes it
        if scenario is None:
            continue
        reached.clear()
        try:
            harness.run(with_scheduling(with_runner(scenario, config.runner), config.scheduling))
        except ScenarioError:
            continue
        if reached:
            search.observe(data, reached[0])
    reached.clear()


def main() -> int:
    return serve("pairs", pair_inputs)


if __name__ == "__main__":
    sys.exit(main())
