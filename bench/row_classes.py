"""Benchmark: which row classes (mambafuzz/conform/row_classes.py) the conform target's random
inputs reach, with and without its worker-row pass (mambafuzz.model.generate.draw_worker_rows).

Run:  python bench/row_classes.py [--seconds 120] [--seed 1] [--plain] [--runners v1,v2]

Draws inputs as `mambafuzz fuzz --target conform --generator random` does (the same case seeds),
judges each with the conform target for --seconds, and prints, per class and runner, how many
inputs reached it, with the inputs per second: a class reached by a few inputs in a minute is
one a PR job's two minutes rarely test. `--plain` leaves the pass out (the generator as the
scheduler target draws). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from mambafuzz.search.startup import prepare_process

prepare_process(conform=True)  # Triton's CPU shim before the conformance tier is imported

from mambafuzz.conform import row_classes as rc  # noqa: E402
from mambafuzz.conform import target  # noqa: E402
from mambafuzz.exit_codes import ToolError  # noqa: E402
from mambafuzz.model import runners as model_runners  # noqa: E402
from mambafuzz.model.generate import RandomSource, draw_worker_rows, random_scenario  # noqa: E402
from mambafuzz.model.scenario import ScenarioError, validate  # noqa: E402
from mambafuzz.store.corpus import content_name  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plain", action="store_true", help="without the conform target's worker-row pass")
    ap.add_argument("--runners", default=",".join(model_runners.names()))
    ap.add_argument("--keep", type=Path, help="write each disagreeing input here (a scenario file, its message as note)")
    args = ap.parse_args()
    runners = tuple(args.runners.split(","))
    cov = rc.ClassCoverage()
    rng = random.Random(args.seed)
    inputs = disagreements = 0
    start = time.monotonic()
    while time.monotonic() - start < args.seconds:
        case_rng = random.Random(rng.getrandbits(63))
        s = random_scenario(case_rng)
        if not args.plain:
            s = draw_worker_rows(RandomSource(case_rng), s)
        if validate(s):
            continue
        try:
            found = target.first_disagreement(s, runners, cov)
        except (ScenarioError, ToolError):
            continue
        if found is not None:
            disagreements += 1
            print(f"DISAGREE {target.signature(found)}: {found.describe()}", flush=True)
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                text = json.dumps({**s.to_json(), "note": found.describe()}, indent=1) + "\n"
                (args.keep / content_name(text, ".json")).write_text(text)
        inputs += 1
    secs = time.monotonic() - start
    print(f"{'plain' if args.plain else 'worker rows'}: {inputs} inputs in {secs:.0f}s ({inputs / secs:.2f}/s), "
          f"{disagreements} disagreeing; classes {cov.line()}")
    for c in rc.ALL_CLASSES:
        print(f"  {c:42} " + "  ".join(f"{r} {cov.inputs.get(r, {}).get(c, 0):>5}" for r in runners))


if __name__ == "__main__":
    main()
