"""What a candidate fix costs: the efficiency differential (`oracle.check_efficiency`'s three
measures: forward steps, hashed snapshots, prefix-hit tokens) of vLLM with and without the fix,
over the committed corpus and a grid of generated configs. A fix that is correct but makes
vLLM do more steps or cache less should say so in its analysis.

    python bench/fix_cost.py corpus/upstream/NAME/fix.py [--random N] [--seed S]
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mambafuzz.model import runners as model_runners

ROOT = Path(__file__).resolve().parents[2]

MEASURES = ("forward_steps", "hashed_snapshots", "prefix_hit_tokens")


@dataclass
class Tally:
    scenarios: int = 0
    changed: int = 0  # scenarios where any measure differs
    fixed_violations: int = 0  # failing without the fix, clean with it
    new_violations: int = 0  # clean without the fix, failing with it
    without: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MEASURES, 0))
    with_fix: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MEASURES, 0))
    worse: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MEASURES, 0))  # scenarios made worse


def measure(scenarios, patches, runner: str | None = None) -> Tally:
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.model.scenario import ScenarioError

    t = Tally()
    for s in scenarios:
        try:
            a = evaluate(s, "fixed", efficiency=False, runner=runner)
            b = evaluate(s, "fixed", efficiency=False, patches=patches, runner=runner)
        except ScenarioError:
            continue
        if a.trace.crash is not None or b.trace.crash is not None:
            t.fixed_violations += (not a.verdict.clean) and b.verdict.clean
            continue  # a crashed run's counts mean nothing
        t.scenarios += 1
        t.fixed_violations += (not a.verdict.clean) and b.verdict.clean
        t.new_violations += a.verdict.clean and not b.verdict.clean
        diff = False
        for m in MEASURES:
            x, y = getattr(a.trace, m), getattr(b.trace, m)
            t.without[m] += x
            t.with_fix[m] += y
            diff |= x != y
            t.worse[m] += (y > x) if m == "forward_steps" else (y < x)
        t.changed += diff
    return t


def corpus_scenarios() -> list:
    from mambafuzz.store.corpus import iter_cases

    dirs = [ROOT / "corpus" / d for d in ("seeds", "regressions", "upstream")]
    return [c.scenario for c in iter_cases(dirs, warn=lambda m: None)]


def grid_scenarios(n: int, seed: int, engine_overrides: dict | None = None) -> list:
    """`n` generated scenarios (the random generator's draw), optionally with engine-config knobs forced."""
    import dataclasses

    from mambafuzz.model.generate import random_scenario

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = random_scenario(rng)
        if engine_overrides:
            s = dataclasses.replace(s, engine=dataclasses.replace(s.engine, **engine_overrides))
        out.append(s)
    return out


GRID = {  # the knobs the upstream findings depend on, forced on a generated mix
    "generated": {},
    "checkpoint blocks 1": {"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 1},
    "dense retention": {"prefix_cache_retention_interval": None},
}


def table(rows: list[tuple[str, Tally]]) -> str:
    head = ("| set | scenarios | changed | fixed viol. | new viol. | forward steps (without → with, worse) "
            "| hashed snapshots | prefix-hit tokens |\n|---|---|---|---|---|---|---|---|")
    lines = [head]
    for name, t in rows:
        cells = [f"{t.without[m]} → {t.with_fix[m]} ({t.worse[m]} worse)" for m in MEASURES]
        lines.append(f"| {name} | {t.scenarios} | {t.changed} | {t.fixed_violations} | {t.new_violations} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("fix", help="a fix.py, or package.module:NAME")
    p.add_argument("--random", type=int, default=100, metavar="N", help="generated scenarios per grid row")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runner", choices=model_runners.names(), help="model runner every scenario runs under (default: "
                   "each scenario's own); a fix of one runner's worker code is measured on that runner")
    args = p.parse_args(argv)
    if args.random < 0:
        p.error("--random must not be negative")
    from mambafuzz.sim import patching

    print(cost_table(patching.load_patches(args.fix), args.random, args.seed, args.runner))
    return 0


def cost_table(patches, random_per_row: int = 100, seed: int = 1, runner: str | None = None) -> str:
    """The markdown cost table of `patches`: the corpus, then each GRID row of generated scenarios."""
    rows = [("corpus (seeds, regressions, upstream)", measure(corpus_scenarios(), patches, runner))]
    for name, overrides in GRID.items():
        if random_per_row:
            rows.append((f"{name} ({random_per_row}, seed {seed})",
                         measure(grid_scenarios(random_per_row, seed, overrides), patches, runner)))
    return table(rows)


if __name__ == "__main__":
    sys.exit(main())
