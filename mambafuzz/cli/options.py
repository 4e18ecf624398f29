"""Options several `mambafuzz` commands share, defined once (and apart from the modules that
import vLLM, so that `--help` stays fast)."""

from __future__ import annotations

import argparse

from mambafuzz.exit_codes import UsageError
from mambafuzz.model import runners

SPLIT_HELP = ("chunk split under test: fixed (installed vLLM, default), prefix (pre-fix behaviour, both gates), "
              "realign (only the pre-fix mid-block realign gate), or package.module:function "
              "(same signature as Scheduler._mamba_block_aligned_split)")


def either(described: dict[str, str]) -> str:
    """`a (what a is), b (...) or c (...)`: a registry's choices for a help text."""
    parts = [f"{name} ({what})" for name, what in described.items()]
    return ", ".join(parts[:-1]) + " or " + parts[-1] if len(parts) > 1 else "".join(parts)


def add_runner_argument(p: argparse.ArgumentParser) -> None:
    """--runner: one model runner from the registry (mambafuzz.model.runners), read when the parser
    is built."""
    p.add_argument("--runner", choices=runners.names(), default=None,
                   help="vLLM model runner the kernel model mirrors: "
                        f"{either({r.name: r.source for r in runners.RUNNERS.values()})}; default: the "
                        "scenario's engine.runner, else what vLLM 0.32 picks on a CUDA host for its config (v2 for "
                        "every config the scenarios express)")


SCHEDULING_HELP = ("scheduler and engine-core loop to drive: sync (Scheduler, EngineCore.step), async "
                   "(AsyncScheduler, EngineCore.step_with_batch_queue, 2 batches in flight) or default (what vLLM "
                   "0.32 picks on a CUDA host: async); default: the scenario's engine.async_scheduling (a "
                   "version-1 file: sync)")

PATCH_HELP = ("apply a candidate fix to the installed vLLM for these runs: path/to/fix.py (its PATCHES) or "
              "package.module:NAME (a list of mambafuzz.sim.patching patches, or a function returning one); repeatable")


def add_patch_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--patch", action="append", default=[], metavar="FIX", help=PATCH_HELP)


def patches_or_usage(specs: list[str]) -> list:
    """The patches named by --patch values; a bad one, or one that no longer applies to the
    installed vLLM, is a usage error."""
    from mambafuzz.sim import patching

    out = []
    for spec in specs:
        try:
            patches = patching.load_patches(spec)
        except patching.PatchSpecError as exc:
            raise UsageError(str(exc)) from None
        problem = patching.check_applies(patches)
        if problem:
            raise UsageError(f"--patch {spec} does not apply to the installed vLLM: {problem}")
        out += patches
    return out
