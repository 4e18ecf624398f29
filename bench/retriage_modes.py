"""Every regression and upstream case, judged under both scheduling modes: the synchronous
Scheduler it was recorded with and vLLM's AsyncScheduler under the batch queue (vLLM 0.32's
default on a CUDA host), on both model runners.

    python bench/retriage_modes.py [--markdown]

For each case and each split its `expected` table names, prints the primary signature per
(runner, mode) and whether async scheduling changes the verdict. Exit 0 always: a report.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mambafuzz.checks.pipeline import signature_of  # noqa: E402
from mambafuzz.model import runners as model_runners  # noqa: E402
from mambafuzz.model.scenario import with_runner, with_scheduling  # noqa: E402
from mambafuzz.store.corpus import iter_cases  # noqa: E402

RUNNERS = model_runners.names()
MODES = ("sync", "async")


def rows():
    dirs = [ROOT / "corpus" / "regressions", ROOT / "corpus" / "upstream"]
    for case in iter_cases(dirs, warn=lambda msg: None):
        splits = sorted({key.split("@")[0] for key in case.expected}) or ["fixed"]
        for split in splits:
            got = {}
            for runner in RUNNERS:
                for mode in MODES:
                    s = with_scheduling(with_runner(case.scenario, runner), mode)
                    got[runner, mode] = signature_of(s, split) or "clean"
            yield str(case.path.relative_to(ROOT)), split, got


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = p.parse_args()
    head = ["case", "split"] + [f"{r} {m}" for r in RUNNERS for m in MODES] + ["async changes it"]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    changed = total = 0
    for name, split, got in rows():
        differs = any(got[r, "sync"] != got[r, "async"] for r in RUNNERS)
        changed += differs
        total += 1
        cells = [name, split] + [f"`{got[r, m]}`" for r in RUNNERS for m in MODES] + ["**yes**" if differs else "no"]
        print("| " + " | ".join(cells) + " |" if args.markdown else "  ".join(cells))
    print(f"\nretriage_modes: {total} (case, split) pairs, {changed} where async scheduling changes the verdict")
    return 0


if __name__ == "__main__":
    sys.exit(main())
