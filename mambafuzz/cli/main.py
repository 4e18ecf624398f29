"""`mambafuzz`: replay, fuzz, minimize and curate scenarios against vLLM's real scheduler.

Exit codes everywhere (mambafuzz/exit_codes.py): 0 clean / nothing found, 1 violation found,
2 bad input or usage, 3 mambafuzz itself failed (unsupported vLLM, dead workers, nothing run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from mambafuzz.cli.options import (
    SCHEDULING_HELP,
    SPLIT_HELP,
    add_patch_argument,
    add_runner_argument,
    either,
    patches_or_usage,
)
from mambafuzz.exit_codes import (
    EXIT_CLEAN,
    EXIT_FOUND,
    EXIT_INTERRUPTED,
    EXIT_TOOL,
    EXIT_USAGE,
    ToolError,
    UsageError,
    one_line,
)
from mambafuzz.search import generators


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        print(f"mambafuzz: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from mambafuzz.sim.bridge.vllm_compat.about import version_line  # imports vLLM only when asked

        print(version_line())
        raise SystemExit(EXIT_CLEAN)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="mambafuzz", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=_VersionAction, help="print the mambafuzz and vLLM versions (and vLLM's path)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    r = sub.add_parser("repro", help="replay scenario files and print their verdicts",
                       description="Run each scenario through vLLM's real scheduler with the kernel model and "
                                   "print the oracle's verdict. A file with an 'expected' table also reports "
                                   "whether the verdict matches it.")
    r.add_argument("files", nargs="+", metavar="FILE")
    r.add_argument("--split", default="fixed", help=SPLIT_HELP)
    add_patch_argument(r)
    add_runner_argument(r)
    r.add_argument("--scheduling", choices=("sync", "async", "default"), default=None, help=SCHEDULING_HELP)
    r.add_argument("--trace", action="store_true", help="print a step table: chunks, slot writes, new hashes")
    r.add_argument("--json", action="store_true", help="print one JSON object per file instead of text")
    r.add_argument("--no-differential", action="store_true", help="skip the prefix-caching-off run")
    r.add_argument("--digest", action="store_true",
                   help="also print a digest of the whole trace (equal digests: identical runs)")
    r.add_argument("--strict-efficiency", action="store_true",
                   help="count the efficiency differential against the installed split as a failure")
    r.add_argument("--base", metavar="VLLM", default=None,
                   help="also run each file on this base vLLM ('installed', or a directory made by ci/pr-overlay) "
                        "and compare the resource figures, as the PR job's efficiency gate does: fewer prefix-hit "
                        "tokens, more forward steps or more peak blocks here is an efficiency_regression (exit 1)")
    r.add_argument("--raw", action="store_true",
                   help="read each FILE as a fuzzing corpus input (corpus/generated, a libFuzzer crash-* file): "
                        "decoded exactly as the fuzz targets decode it, scenario JSON when it parses, else the "
                        "bytes decoder")
    r.add_argument("--decoder", choices=tuple(generators.decoders()), default="bytes",
                   help="with --raw: the decoder of the generator that kept the input (default bytes): "
                        + either({d: "--generator " + ", ".join(gs) for d, gs in generators.decoders().items()}))
    r.add_argument("--all-versions", action="store_true",
                   help="replay in every vLLM environment found (this one, .venv-vllm-* in the checkout, the "
                        "environments MAMBAFUZZ_VLLM_ENVS lists) and say in which each case reproduces (exit 1 if "
                        "it reproduces in any)")
    r.add_argument("--print-scenario", action="store_true",
                   help="print the scenario JSON each FILE stands for (with --raw: what the input decodes to) "
                        "instead of running it, to save and edit")

    from mambafuzz.cli import fuzzing as cli_fuzz  # the fuzzing commands live beside this file

    cli_fuzz.add_commands(sub)
    from mambafuzz.cli.engine_repro import add_engine_commands

    add_engine_commands(sub)
    from mambafuzz.cli.conformance import add_conform_command

    add_conform_command(sub)
    from mambafuzz.cli.export import add_export_commands

    add_export_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _prepare(args)
        return args.handler(args) if hasattr(args, "handler") else cmd_repro(args)
    except UsageError as exc:
        print(f"mambafuzz: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ToolError as exc:
        print(f"mambafuzz: {exc}", file=sys.stderr)
        return EXIT_TOOL
    except KeyboardInterrupt:
        print("mambafuzz: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - a crash of the tool must never read as a finding (exit 1)
        if os.environ.get("MAMBAFUZZ_DEBUG"):
            traceback.print_exc()
        print(f"mambafuzz: internal error: {one_line(exc, where=True)} "
              "(a tool failure, not a finding; MAMBAFUZZ_DEBUG=1 prints the traceback)", file=sys.stderr)
        return EXIT_TOOL


def _prepare(args: argparse.Namespace) -> None:
    """The process's start-up step (mambafuzz.search.startup), once, before any command runs: a
    planted bug (MAMBAFUZZ_MUTANT) and, for the commands that run the conformance tier (`conform`,
    `fuzz --target conform`), Triton's CPU shim. Imports nothing when there is nothing to do."""
    from mambafuzz.search import fuzz_targets
    from mambafuzz.search.startup import prepare_process

    target = getattr(args, "target", None)
    prepare_process(conform=getattr(args, "conform_kernels", False)
                    or (target in fuzz_targets.TARGETS and fuzz_targets.get(target).conform_kernels))


def _split_or_usage(name: str):
    from mambafuzz.sim.engine import splits

    try:
        splits.resolve(name)
    except splits.SplitError as exc:
        raise UsageError(str(exc)) from None


def cmd_repro(args: argparse.Namespace) -> int:
    if args.all_versions:
        from mambafuzz.tools.repro_versions import repro_all_versions

        return repro_all_versions(args.files, args.split)
    _split_or_usage(args.split)
    patches = patches_or_usage(args.patch)
    worst = EXIT_CLEAN
    base = None
    if args.base is not None:
        from mambafuzz.search import pr

        base = pr.start_base(pr.check_where(args.base), args.split)
    try:
        for path in args.files:
            worst = max(worst, _repro_one(args, path, patches, base))
    finally:
        if base is not None:
            base.close()
    return worst


def _repro_one(args: argparse.Namespace, path: str, patches, base) -> int:
    """Replay one file as `repro` does; its exit code."""
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.model.scenario import ScenarioError, engine_realism_notes, with_runner, with_scheduling
    from mambafuzz.store import corpus
    from mambafuzz.store.report import describe, step_table, trace_digest

    try:
        case = _load_raw_input(path, args.decoder) if args.raw else corpus.load_case(path)
    except corpus.CaseError as exc:
        hint = "; a fuzzing corpus input? add --raw" if isinstance(exc, corpus.NotJsonText) else ""
        print(f"mambafuzz: {exc}{hint}", file=sys.stderr)
        return EXIT_USAGE
    if args.print_scenario:
        print(case.scenario.dumps(), end="")
        return EXIT_CLEAN
    try:
        scenario = with_scheduling(case.scenario, args.scheduling)
        if base is not None:
            base.figures_begin(with_runner(scenario, args.runner))
        try:
            ev = evaluate(scenario, args.split, differential=not args.no_differential,
                          strict_efficiency=args.strict_efficiency, patches=patches, runner=args.runner)
        finally:
            theirs = base.figures_end() if base is not None else None
    except ScenarioError as exc:
        print(f"mambafuzz: {path}: {'; '.join(exc.problems)}", file=sys.stderr)
        return EXIT_USAGE
    worst = EXIT_CLEAN
    against = None
    if base is not None:
        from mambafuzz.search.pr import compare_figures

        ours, gap = compare_figures(ev.trace, theirs)
        against = {"where": base.where, "figures": ours, "base_figures": theirs,
                   "signature": None if gap is None else gap.signature, "message": None if gap is None else gap.message}
        if gap is not None:
            worst = EXIT_FOUND
    # a patched vLLM is not the one `expected` describes
    expected = None if patches or args.scheduling else corpus.expected_for(case.expected, args.split, ev.trace.runner)
    notes = engine_realism_notes(case.scenario.engine)
    if args.json:
        obj = describe(path, args.split, ev, expected)
        obj["runner"], obj["mixer"] = ev.trace.runner, ev.trace.mixer
        obj["realism_notes"] = notes
        if args.digest:
            obj["digest"] = trace_digest(ev.trace)
        if against is not None:
            obj["against_base"] = against
        print(json.dumps(obj))
    else:
        mode = "async" if ev.trace.async_scheduling else "sync"
        _print_text(path, f"{args.split}, runner {ev.trace.runner}, {mode}", ev, expected, notes)
        if args.trace:
            print(step_table(ev.trace))
        if args.digest:
            print(f"  trace digest: {trace_digest(ev.trace)}")
        if against is not None:
            print(f"  against the base ({against['where']}): "
                  + ("the base cannot run it" if theirs is None else against["message"] or
                     f"no efficiency regression ({', '.join(f'{k} {v}' for k, v in against['figures'].items())})"))
            if against["signature"]:
                print(f"  signature: {against['signature']}")
    return EXIT_FOUND if not ev.verdict.clean else worst


def _load_raw_input(path: str, decoder: str = "bytes"):
    """A corpus input decoded as the fuzz targets decode it (mambafuzz.model.inputs.decode_input)."""
    from mambafuzz.model.inputs import MAX_INPUT_BYTES, decode_input
    from mambafuzz.store import corpus

    data = corpus.read_case_bytes(path, MAX_INPUT_BYTES, ", more than a fuzz target reads")
    scenario = decode_input(data, decoder)
    if scenario is None:
        raise corpus.CaseError(f"{path}: does not decode to a valid scenario with the {decoder} decoder "
                               "(the fuzz targets skip it)")
    return corpus.Case(Path(path), scenario)


def _print_text(path: str, split: str, ev, expected: str | None, notes: list[str]) -> None:
    v = ev.verdict
    head = "clean" if v.clean else f"VIOLATION {v.kind}"
    print(f"{path} [split {split}]: {head}")
    for f in v.findings:
        print(f"  {f.kind}: {f.message}")
        print(f"  signature: {f.signature}")
        if f.fine_signature != f.signature:
            print(f"  fine signature: {f.fine_signature}")
    for f in v.reports:
        print(f"  report ({f.kind}): {f.message}")
    if expected is not None:
        print(f"  expected: {expected} ({'matches' if expected == v.kind else 'MISMATCH'})")
    if not v.clean:
        for note in notes:
            print(f"  note: {note}")


if __name__ == "__main__":
    raise SystemExit(main())
