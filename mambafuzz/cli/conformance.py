"""`mambafuzz conform`: hold the kernel model against vLLM's own worker code (mambafuzz/conform/compare.py)."""

from __future__ import annotations

import argparse
import collections
import contextlib
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

from mambafuzz.cli.options import add_patch_argument, patches_or_usage
from mambafuzz.exit_codes import EXIT_CLEAN, EXIT_FOUND, EXIT_TOOL, EXIT_USAGE, ToolError, one_line
from mambafuzz.model import runners as model_runners


def add_conform_command(sub: Any) -> None:
    c = sub.add_parser(
        "conform", help="check the kernel model against vLLM's own worker code, row by row",
        description="Run each scenario (FILEs, then --random SECONDS of generated ones) through the real "
                    "scheduler, and for every scheduled row compare what the kernel model says the worker does "
                    "with what vLLM's own worker code does when called on CPU (V1: InputBatch, preprocess_mamba, "
                    "the metadata builders; V2: MambaHybridModelState; the fused copies under Triton's "
                    "interpreter): the block read, the blocks written, the pre- and post-forward copies, the "
                    "internal checkpoint. Both mixer families. Prints the first row of each kind of "
                    "disagreement. Exit 1 if any, 0 if none, 2 on bad input. Slow: Triton's interpreter.")
    c.add_argument("files", nargs="*", metavar="FILE")
    c.add_argument("--runner", choices=model_runners.names(), action="append",
                   help="model runner(s) to check (default: every one registered)")
    c.add_argument("--random", type=float, default=0.0, metavar="SECONDS",
                   help="also check generated scenarios for this long")
    c.add_argument("--seed", type=int, default=1, metavar="N", help="PRNG seed for --random (default 1)")
    add_patch_argument(c)  # a case filed by `fuzz --target conform --patch` replays under the same patches
    c.set_defaults(handler=cmd_conform, conform_kernels=True)  # cli.main's start-up step enables Triton's shim


# The releases whose worker code the conformance tier drives (their builders, InputBatch and
# model state); elsewhere the scheduler-level harness still runs, this tier does not.
CONFORM_RELEASES = ("0.32.", "0.33.")


@contextlib.contextmanager
def worker_code_of_other_releases_is_unsupported() -> Iterator[None]:
    """On a release outside CONFORM_RELEASES, a worker API that is missing or shaped differently
    (AttributeError, TypeError) is an unsupported vLLM, said in one line, not an internal error."""
    try:
        yield
    except (AttributeError, TypeError) as exc:
        from mambafuzz.sim.bridge.vllm_compat.about import vllm_version

        version = vllm_version()
        if version.startswith(CONFORM_RELEASES):
            raise
        raise ToolError(f"the conformance tier drives the worker code of vLLM {' and '.join(r + 'x' for r in CONFORM_RELEASES)}; "
                        f"vLLM {version}'s differs ({one_line(exc, where=True)})") from None


def cmd_conform(args: argparse.Namespace) -> int:
    from mambafuzz.conform import compare as conform_check
    from mambafuzz.conform import target as conform_target
    from mambafuzz.conform.drive import SchedulerRaised
    from mambafuzz.model.generate import RandomSource, draw_worker_rows, random_scenario
    from mambafuzz.model.scenario import ScenarioError, validate
    from mambafuzz.sim import patching
    from mambafuzz.sim.bridge import configs
    from mambafuzz.store import corpus

    if args.random < 0:
        print("mambafuzz: --random must not be negative", file=sys.stderr)
        return EXIT_USAGE
    if not args.files and not args.random:
        print("mambafuzz: give scenario FILEs or --random SECONDS (see --help)", file=sys.stderr)
        return EXIT_USAGE
    runners = tuple(args.runner or model_runners.names())
    patches = patches_or_usage(args.patch)
    seen: collections.Counter = collections.Counter()
    bad = checked = unjudged = 0

    skipped: collections.Counter = collections.Counter()  # runner -> scenarios it cannot run

    def check(scenario, where: str) -> None:
        nonlocal checked
        with patching.applied(patches), worker_code_of_other_releases_is_unsupported():
            ran = False
            for runner, own in conform_check.per_runner(scenario, runners):
                if own is None:
                    skipped[runner] += 1
                    continue
                ran = True
                for d in conform_check.compare(own, (runner,)):
                    seen[d.key] += 1
                    if seen[d.key] == 1:
                        print(f"DISAGREE {conform_target.signature(d)} {where} {d.describe()}", flush=True)
        checked += ran  # a scenario no chosen runner can run was not checked

    for path in args.files:
        try:
            check(corpus.load_case(path).scenario, path)
        except (corpus.CaseError, ScenarioError, configs.ConfigRejected) as exc:
            print(f"mambafuzz: {exc}", file=sys.stderr)
            bad += 1
        except SchedulerRaised as exc:
            print(f"NOT JUDGED {path}: {exc}", flush=True)
            unjudged += 1
    rng = random.Random(args.seed)
    start = last = time.monotonic()
    while time.monotonic() - start < args.random:
        s = draw_worker_rows(RandomSource(rng), random_scenario(rng))  # as the conform fuzz target draws
        if validate(s):
            continue
        try:
            check(s, f"random(seed {args.seed}) #{checked}")
        except (configs.ConfigRejected, SchedulerRaised):
            continue
        if time.monotonic() - last >= 10:
            last = time.monotonic()
            print(f"[{last - start:6.1f}s] {checked} scenarios, {sum(seen.values())} disagreeing rows", flush=True)
    print(f"conform: {checked} scenario(s) on {'+'.join(runners)} x gdn+mamba2, "
          f"{sum(seen.values())} disagreeing row(s) in {len(seen)} kind(s){f', {bad} unusable' if bad else ''}"
          + (f", {unjudged} not judged (vLLM's scheduler raised)" if unjudged else "")
          + "".join(f"; {n} not run on {r} (a config {r} cannot run, e.g. pipeline stages)" for r, n in sorted(skipped.items())))
    if seen:
        return EXIT_FOUND
    if bad:
        return EXIT_USAGE
    if not checked:  # a check that checked nothing must not pass
        print("mambafuzz: conform checked no scenario (give files, or a longer --random)", file=sys.stderr)
        return EXIT_TOOL
    return EXIT_CLEAN
