"""What atheris instrumentation costs per execution, and how much code it covers, three ways:

- `none`: nothing instrumented (the random generator's speed);
- `import-hook`: `atheris.instrument_imports(include=["vllm.v1.core", "vllm.v1.kv_cache_interface",
  "mambafuzz.model.generate"])` around the target's imports, as the target did until 2026-12-01; atheris
  keeps only each name's top-level package, so that instruments all of vllm and fuzz;
- `scoped`: mambafuzz.search.instrumentation.instrument_modules(fuzz_targets.COVERAGE_MODULES), what the target does now.

Each mode runs in its own process over the same seeded inputs (decode + evaluate, as one fuzz
execution does), after a warm-up.  Prints executions/s and the ratio to `none` measured in
the same run.

    python bench/instrumentation_cost.py [--inputs 150] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import gc, json, os, random, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, sys.argv[1])
mode, n_inputs, reps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
count = 0
if mode == "import-hook":
    import atheris
    with atheris.instrument_imports(include=["vllm.v1.core", "vllm.v1.kv_cache_interface", "mambafuzz.model.generate"]):
        from mambafuzz.checks.pipeline import evaluate
        from mambafuzz.model.inputs import decode_input
    import types
    count = sum(1 for o in gc.get_objects() if isinstance(o, types.FunctionType)
                and "__ATHERIS_INSTRUMENTED__" in o.__code__.co_consts)
else:
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.model.inputs import decode_input
    if mode == "scoped":
        from mambafuzz.search.fuzz_targets import COVERAGE_MODULES
        from mambafuzz.search.instrumentation import instrument_modules
        count = instrument_modules(COVERAGE_MODULES)
from mambafuzz.model.scenario import ScenarioError
rng = random.Random(7)
inputs = [bytes(rng.getrandbits(8) for _ in range(rng.randint(16, 400))) for _ in range(n_inputs)]
scenarios = [s for s in (decode_input(b) for b in inputs) if s is not None]
def one_pass():
    for s in scenarios:
        try:
            evaluate(s, "fixed", efficiency=False)
        except ScenarioError:
            pass
one_pass()  # warm-up: config builds, caches
gc.freeze()
times = []
for _ in range(reps):
    t0 = time.process_time()
    one_pass()
    times.append(time.process_time() - t0)
print(json.dumps({"mode": mode, "functions": count, "scenarios": len(scenarios), "times": times}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", type=int, default=150, help="random byte inputs (default 150)")
    p.add_argument("--reps", type=int, default=3, help="timed passes per mode (default 3)")
    args = p.parse_args()
    if args.inputs < 1 or args.reps < 1:
        print("instrumentation_cost: --inputs and --reps must be at least 1", file=sys.stderr)
        return 2
    rows = {}
    for mode in ("none", "import-hook", "scoped"):
        proc = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), mode, str(args.inputs), str(args.reps)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"instrumentation_cost: mode {mode} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}",
                  file=sys.stderr)
            return 3
        rows[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    base = statistics.median(rows["none"]["times"])
    n = rows["none"]["scenarios"]
    print(f"{n} decoded scenarios per pass, {args.reps} passes, CPU time, median")
    print(f"{'mode':<12} {'functions':>9} {'exec/s':>8} {'time / none':>11}")
    for mode, row in rows.items():
        t = statistics.median(row["times"])
        print(f"{mode:<12} {row['functions']:>9} {n / t:>8.1f} {t / base:>10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
