"""Planting a mutant by name, in this process: a hand-planted bug (`planted.MUTANTS`) or a
generated one (`mm:<Class.function>:<n>`, `operators`). `MAMBAFUZZ_MUTANT` names the one a
process's start-up step (`mambafuzz.search.startup.prepare_process`) plants.

Imports nothing heavy at module level: the start-up step of a process with no mutant to plant
reads `MUTANT_ENV` here without importing vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mambafuzz.sim.patching import Patch

MUTANT_ENV = "MAMBAFUZZ_MUTANT"


def patches(name: str) -> list[Patch]:
    """A planted bug's patches: a name in `planted.MUTANTS`, or a generated mutant id (`mm:...`,
    `operators`)."""
    if name.startswith("mm:"):
        from mambafuzz.tools.mutation import operators

        return list(operators.patches(name))
    from mambafuzz.tools.mutation.planted import MUTANTS

    if name not in MUTANTS:
        raise KeyError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}")
    return MUTANTS[name][1]()


def apply(name: str) -> None:
    """Plant `name` for the rest of this process."""
    from mambafuzz.sim import patching

    for p in patches(name):
        patching.apply_one(p)
