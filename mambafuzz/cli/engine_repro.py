"""`mambafuzz engine-repro`: confirm scenarios on a real vLLM engine (CPU backend).

Registered by `mambafuzz.cli.main` through `add_engine_commands(sub)`.  Exit codes as everywhere:
0 every file agreed or was skipped, 1 a divergence or an engine crash, 2 bad input.
vLLM is imported only when the command runs, so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mambafuzz.cli.options import SPLIT_HELP
from mambafuzz.exit_codes import EXIT_CLEAN, EXIT_FOUND, EXIT_USAGE


def add_engine_commands(sub: Any) -> None:
    e = sub.add_parser(
        "engine-repro", help="replay scenario files on a real vLLM engine, prefix caching on vs off",
        description="Run each scenario through a real in-process vLLM engine (CPU backend, the tiny qwen3_next "
                    "model built on first use) twice: align-mode prefix caching with the split under test, and "
                    "prefix caching off. Report whether greedy tokens and logprobs agree, and whether the "
                    "engine's per-step schedule equals the harness's trace. Scenarios the CPU engine cannot run "
                    "are skipped with the reason. Exit 1 on a divergence or an engine crash, 2 on bad input.")
    e.add_argument("files", nargs="+", metavar="FILE")
    e.add_argument("--split", default="fixed", help=SPLIT_HELP)
    e.add_argument("--json", action="store_true", help="print one JSON object per file instead of text")
    e.set_defaults(handler=cmd_engine_repro)


def cmd_engine_repro(args: argparse.Namespace) -> int:
    from mambafuzz.model.scenario import ScenarioError
    from mambafuzz.sim.engine import splits
    from mambafuzz.store import corpus

    try:
        splits.resolve(args.split)
    except splits.SplitError as exc:
        print(f"mambafuzz: {exc}", file=sys.stderr)
        return EXIT_USAGE
    cases = []
    worst = EXIT_CLEAN
    for path in args.files:  # validate every file before paying for an engine
        try:
            cases.append(corpus.load_case(path))
        except corpus.CaseError as exc:
            print(f"mambafuzz: {exc}", file=sys.stderr)
            worst = EXIT_USAGE
    if not cases:
        return worst
    from mambafuzz.engine_tier.engine_repro import confirm

    for case in cases:
        try:
            result = confirm(case.scenario, args.split)
        except ScenarioError as exc:
            print(f"mambafuzz: {case.path}: {'; '.join(exc.problems)}", file=sys.stderr)
            worst = EXIT_USAGE
            continue
        if args.json:
            print(json.dumps({"file": str(case.path), **result}), flush=True)
        else:
            _print_text(str(case.path), result)
        if result["status"] in ("diverged", "crashed") and worst == EXIT_CLEAN:
            worst = EXIT_FOUND
    return worst


def _print_text(path: str, r: dict[str, Any]) -> None:
    head = r["status"].upper() + (f" {r['kind']}" if r.get("kind") else "")
    print(f"{path} [split {r['split']}] engine: {head}: {r['reason']}", flush=True)
    for a in r.get("adapted", []):
        print(f"  adapted: {a}")
    for t in r.get("near_ties", []):
        print(f"  note: {t}")
    if r["status"] == "skipped":
        return
    if r.get("schedule_match") is True:
        print("  schedule: identical to the harness's trace")
    elif r.get("schedule_match") is False:
        print(f"  schedule: DIFFERS from the harness's trace: {r['schedule_diff']}")
    if r.get("schedule_note"):
        print(f"  schedule note: {r['schedule_note']}")
    if "replay_s" in r:
        print(f"  time: engine start {r.get('startup_s', 0):.1f}s, replays {r['replay_s']:.1f}s")
