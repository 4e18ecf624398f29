"""The vLLM model runners the tool mirrors, registered once by name.

A scenario's `engine.runner`, every `--runner` option, a corpus file's `split@runner` keys, the
bridge (which flag vLLM's Scheduler is told), the audit plugin (which runner a live engine runs)
and the reports all read this registry; an unknown name is a one-line `UnknownRunner`, never
taken for V1.  What a runner does lives with the layer that needs it, each keyed by the name
registered here: its row facts in the kernel model (`RULES` in mambafuzz/sim/worker/runners.py) and the
driver of vLLM's own worker code (`WORKERS` in mambafuzz/conform/drive.py); tests/search/test_registries.py
fails when a name here lacks either.  Imports nothing: validation and `--help` read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


class UnknownRunner(ValueError):
    """A runner name nothing is registered for (one line)."""


@dataclass(frozen=True)
class Runner:
    name: str  # engine.runner, --runner, the `@runner` of an expected-table key
    title: str  # what reports call it
    source: str  # where vLLM keeps it (--help)
    # What vLLM's Scheduler is told (`Scheduler.use_v2_model_runner`, read by `VllmConfig.max_concurrent_batches`
    # too): it changes how SchedulerOutput hands resumed requests to the worker, not what is scheduled.
    use_v2_model_runner: bool
    # vLLM itself runs this runner when its `use_v2_model_runner` flag has the value above: the bridge's
    # default runner and the audit plugin's reading of a live engine map vLLM's flag back to it.
    vllm_picks: bool = False


RUNNERS: dict[str, Runner] = {r.name: r for r in (
    Runner("v1", "Model Runner V1", "gpu_model_runner.py", use_v2_model_runner=False, vllm_picks=True),
    Runner("v2", "Model Runner V2", "gpu/model_runner.py", use_v2_model_runner=True, vllm_picks=True),
)}


def names() -> tuple[str, ...]:
    """Every registered runner's name, in registration order."""
    return tuple(RUNNERS)


def _one_of() -> str:
    return f"one of {', '.join(RUNNERS)}"


def get(name: str) -> Runner:
    """The entry registered as `name`; an unknown name is an UnknownRunner."""
    try:
        return RUNNERS[name]
    except (KeyError, TypeError):
        raise UnknownRunner(f"unknown model runner {name!r} ({_one_of()})") from None


def part_of(table: dict[str, T], name: str, what: str, where: str) -> T:
    """The runner registered as `name`'s entry in a layer's own table (its kernel-model rules, its
    conformance worker); an unknown runner, or one the table lacks, is a one-line UnknownRunner."""
    entry = get(name)
    try:
        return table[entry.name]
    except KeyError:
        raise UnknownRunner(f"model runner {name!r} has no {what} ({where})") from None


def picked_by_vllm(use_v2_model_runner: bool) -> Runner:
    """The runner vLLM runs when its `use_v2_model_runner` flag is `use_v2_model_runner`."""
    found = [r for r in RUNNERS.values() if r.vllm_picks and r.use_v2_model_runner == bool(use_v2_model_runner)]
    if len(found) != 1:
        raise UnknownRunner(f"{len(found)} registered model runners are vLLM's pick for use_v2_model_runner="
                            f"{bool(use_v2_model_runner)} ({', '.join(r.name for r in found) or 'none'}); need one")
    return found[0]

