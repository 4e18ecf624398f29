"""Replay every input of some corpus directories once (under `ci/coverage`'s coverage.py).

    python -m mambafuzz.tools.coverage_replay [--split S] DIR...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mambafuzz.checks.pipeline import evaluate
from mambafuzz.model.inputs import decode_input, iter_input_files
from mambafuzz.model.scenario import ScenarioError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mambafuzz.tools.coverage_replay", description=__doc__)
    p.add_argument("dirs", nargs="+")
    p.add_argument("--split", default="fixed")
    args = p.parse_args(argv)
    stats: dict = {}
    kinds: dict[str, int] = {}
    for _path, data in iter_input_files([Path(d) for d in args.dirs], stats):
        scenario = decode_input(data)
        if scenario is None:
            stats["skipped"] += 1
            continue
        try:
            kind = evaluate(scenario, args.split, efficiency=False).verdict.kind
        except ScenarioError:
            kind = "rejected"
        kinds[kind] = kinds.get(kind, 0) + 1
    print(f"replayed {stats['loaded']} inputs ({stats['skipped']} skipped): {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
