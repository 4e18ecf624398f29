"""The fuzz targets: what judges each input of a campaign (`mambafuzz fuzz --target NAME`).

A target registers once, here or from a test (`register`), and everything that differs between
targets is read from its entry: the CLI's choices, help and argument rules, the campaign's one
line of description, the worker's triage stage (`build`), whether its workers draw the worker's
row edges on top of each generated scenario, whether the process needs Triton's CPU shim for
vLLM's worker kernels, which modules atheris instruments for it, and whether PR mode groups its
new findings by their divergence from the base.

Importing this module imports no vLLM: `build` imports what its target needs when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The system under test (vLLM's scheduler, KV-cache manager and coordinator, the checkpoint
# rules), our restated pre-fix splits (they stand in for vLLM's split under --split prefix),
# and the input decoders (new decoded shapes are worth keeping).
COVERAGE_MODULES = ("vllm.v1.core", "vllm.v1.kv_cache_interface", "mambafuzz.sim.engine.splits", "mambafuzz.model.generate")
# The conform target is also rewarded for new paths through the two sides it compares: the
# kernel model with its runner and mixer rules, and the conformance tier that calls vLLM's
# worker code (not vLLM's worker modules themselves: their Triton kernels run in Triton's
# interpreter, which must see them as written).
CONFORM_MODULES = ("mambafuzz.sim.worker.kernel_model", "mambafuzz.sim.worker.runners", "mambafuzz.sim.worker.mixers",
                   "mambafuzz.conform.compare", "mambafuzz.conform.drive", "mambafuzz.conform.rows",
                   "mambafuzz.conform.v1", "mambafuzz.conform.v2", "mambafuzz.conform.target")


@dataclass
class Built:
    """What a target gives a worker's runtime: its triage stage, and optionally a judge for each
    input's first judgement (when that counts more than triage's re-checks) and the row-class
    counts it keeps."""

    triage: Any  # mambafuzz.search.triage.Triage
    first_judge: Any = None  # mambafuzz.checks.pipeline.Judge
    row_classes: Any = None  # mambafuzz.conform.row_classes.ClassCoverage


@dataclass(frozen=True)
class FuzzTarget:
    name: str
    help: str  # its clause in `--target`'s help
    build: Callable[[Any, Any], Built]  # (WorkerConfig, findings store) -> Built
    coverage_modules: tuple[str, ...] = COVERAGE_MODULES  # what atheris instruments for it
    conform_kernels: bool = False  # the process needs Triton's CPU shim (it runs vLLM's worker kernels)
    draws_worker_rows: bool = False  # its workers draw the worker's row edges on each generated scenario
    groups_against_base: bool = True  # PR mode groups its new findings by their divergence from the base
    usage_error: Callable[[Any], str | None] = lambda args: None  # a `mambafuzz fuzz` argument it refuses
    describe: Callable[[Any], str] = lambda args: ""  # the campaign's first line: what it fuzzes


TARGETS: dict[str, FuzzTarget] = {}


class UnknownTarget(ValueError):
    pass


def register(target: FuzzTarget) -> FuzzTarget:
    if target.name in TARGETS:
        raise ValueError(f"fuzz target {target.name!r} is registered already")
    TARGETS[target.name] = target
    return target


def get(name: str) -> FuzzTarget:
    try:
        return TARGETS[name]
    except KeyError:
        raise UnknownTarget(f"unknown fuzz target {name!r} (one of {', '.join(TARGETS)})") from None


def names() -> tuple[str, ...]:
    return tuple(TARGETS)


def help_text() -> str:
    return "what judges each input: " + "; or ".join(f"{t.name} ({t.help})" for t in TARGETS.values())


# ---- the shipped targets ---------------------------------------------------------------
def _scheduler(config, store) -> Built:
    from mambafuzz.checks.pipeline import oracle_judge
    from mambafuzz.search.triage import Triage, known_signatures
    from mambafuzz.store.known_bugs import untriaged_candidates

    known = known_signatures([Path(d) for d in config.known_dirs], config.split, config.runner)
    triage = Triage(store, config.split, oracle_judge(config.split), known=known,
                    minimize_budget=config.minimize_budget, announce=False,
                    untriaged=untriaged_candidates([Path(d) for d in config.untriaged_dirs]))
    if config.base:  # PR mode; every input runs on the base too, and more work than the base's is a finding
        from mambafuzz.search import pr

        pr.judge_against_base(triage, config.base, config.known_fix_dirs, efficiency_allowed=config.efficiency_allowed)
    return Built(triage)


def _conform(config, store) -> Built:
    from mambafuzz.conform import target as conform_target
    from mambafuzz.conform.row_classes import ClassCoverage
    from mambafuzz.model import runners as model_runners
    from mambafuzz.search.triage import Triage

    runners = (config.runner,) if config.runner else model_runners.names()
    row_classes = ClassCoverage()
    first_judge = conform_target.judge(runners, config.patches, row_classes)
    # No known bugs: they are the oracles' business, and attributed by replaying those.
    triage = Triage(store, config.split, conform_target.judge(runners, config.patches), known_bugs=[],
                    minimize_budget=config.minimize_budget, announce=False)
    if config.base:  # PR mode: a disagreement the base's worker code shows too is pre-existing
        from mambafuzz.search import pr

        pr.judge_against_base(triage, config.base, config.known_fix_dirs, conform_runners=list(runners))
    return Built(triage, first_judge, row_classes)


def _conform_usage(args) -> str | None:
    if args.split != "fixed":
        return "--target conform runs the installed split (fixed); --split does not apply"
    if args.with_known_fixes or args.confirm_engine:
        flag = "--with-known-fixes" if args.with_known_fixes else "--confirm-engine"
        return f"--target conform: {flag} does not apply (it is about the scheduler target's findings)"
    if args.base is not None and args.allow_efficiency:
        return "--target conform: --allow-efficiency does not apply (the efficiency gate judges the scheduler target's runs)"
    return None


def _describe_scheduler(args) -> str:
    runner = f", model runner {args.runner}" if args.runner else ""
    if args.scheduling:
        runner += f", {args.scheduling} scheduling"
    return f"split {args.split}{runner}"


def _describe_conform(args) -> str:
    from mambafuzz.model import runners as model_runners

    return f"the kernel model against vLLM's worker code on {args.runner or '+'.join(model_runners.names())}"


register(FuzzTarget(
    "scheduler", "the default: the oracles check the prefix cache on vLLM's real scheduler", _scheduler,
    describe=_describe_scheduler))
register(FuzzTarget(
    "conform", "the kernel model, i.e. the simulated worker the oracles rely on, against vLLM's own worker code "
    "called on CPU, row by row, as `mambafuzz conform` does; a disagreement is filed as conform:<field>/<mixer>@<runner> "
    "and replays with `mambafuzz conform FILE --runner R`; --runner picks the runner checked, default every one; "
    "coverage also comes from the kernel model and the conformance tier; slow: Triton's interpreter",
    _conform, coverage_modules=COVERAGE_MODULES + CONFORM_MODULES, conform_kernels=True, draws_worker_rows=True,
    groups_against_base=False, usage_error=_conform_usage, describe=_describe_conform))
