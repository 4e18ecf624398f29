"""Which branches of vLLM's scheduling and KV-cache code one input reaches, via coverage.py
(its C tracer, restricted to those files): the feature set for corpus merge, prune and stats."""

from __future__ import annotations

import os
from pathlib import Path

from mambafuzz.model.scenario import Scenario, ScenarioError
from mambafuzz.sim.bridge.vllm_compat.api import vllm_package as vllm
from mambafuzz.sim.engine.harness import run
from mambafuzz.sim.engine.splits import resolve

VLLM_ROOT = Path(vllm.__file__).parent
TARGET_GLOBS = [str(VLLM_ROOT / "v1" / "core" / "*"), str(VLLM_ROOT / "v1" / "core" / "sched" / "*"),
                str(VLLM_ROOT / "v1" / "kv_cache_interface.py")]

Feature = tuple[str, int, int]


class FeatureTracer:
    def __init__(self) -> None:
        import coverage

        self._cov = coverage.Coverage(data_file=None, branch=True, include=TARGET_GLOBS, config_file=False)

    def features(self, scenario: Scenario, split: str = "fixed") -> frozenset[Feature]:
        fn = resolve(split)
        self._cov.erase()
        self._cov.start()
        try:
            run(scenario, fn, split)
        except ScenarioError:
            return frozenset()
        finally:
            self._cov.stop()
        data = self._cov.get_data()
        out: set[Feature] = set()
        for f in data.measured_files():
            short = os.path.relpath(f, VLLM_ROOT)
            for a, b in data.arcs(f) or ():
                out.add((short, a, b))
        return frozenset(out)
