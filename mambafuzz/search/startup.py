"""The one start-up step of a process that runs scenarios: what it changes in vLLM (or in the
Triton it uses) for the rest of its life, done when its entry point asks, never on import.

`prepare_process` does, in this order:
1. Triton's CPU shim (mambafuzz.sim.bridge.vllm_compat.triton_cpu) when the process runs the
   conformance tier: it must come before any vLLM kernel module is imported, and a `--patch`
   may name a conformance module;
2. the planted bug `MAMBAFUZZ_MUTANT` names (mutation testing: mambafuzz.tools.mutation.planting);
3. the `--patch` specs and the `--with-known-fixes` directories (a fuzz worker's WorkerConfig).

Its callers, one call each before their first scenario: the fuzz workers (the atheris target
mambafuzz/search/targets/fuzz_scheduler.py, before it instruments, and the random worker), the
base-oracle process, the `mambafuzz` command (every subcommand: repro, minimize, conform, the
supervisor's own replays, engine-repro, ...), and tests/conftest.py for the test processes.

Imports nothing heavy itself: a process with nothing to prepare does not import vLLM here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from mambafuzz.tools.mutation.planting import MUTANT_ENV

_planted: set[str] = set()  # the mutants this process has planted (once each, however often asked)


def prepare_process(patches: Sequence[str] = (), known_fix_dirs: Sequence[str] = (), *, conform: bool = False,
                    mutant: str | None = None) -> None:
    """Prepare this process (see the module docstring). `mutant`: the planted bug's name, by
    default the environment's MAMBAFUZZ_MUTANT (unset or empty: none). Triton's shim and the
    planted bug are applied once per process; `patches` and `known_fix_dirs` on every call."""
    if conform:
        from mambafuzz.sim.bridge.vllm_compat import triton_cpu

        triton_cpu.enable()  # idempotent
    name = os.environ.get(MUTANT_ENV) if mutant is None else mutant
    if name and name not in _planted:
        from mambafuzz.tools.mutation import planting

        planting.apply(name)
        _planted.add(name)
    if patches:
        from mambafuzz.sim import patching

        for spec in patches:
            for p in patching.load_patches(spec):
                patching.apply_one(p)
    if known_fix_dirs:
        from mambafuzz.store.known_bugs import apply_known_fixes

        apply_known_fixes([Path(d) for d in known_fix_dirs])


def prepare_worker(config) -> None:
    """A fuzz worker's start-up: `prepare_process` for its WorkerConfig (mambafuzz.search.worker_protocol)."""
    prepare_process(config.patches, config.known_fix_dirs, conform=config.conform_kernels)
