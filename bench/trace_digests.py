"""Verdicts and trace digests over the whole corpus plus N generated scenarios, to show that a
refactor changed nothing a run does.  Record before, compare after:

    python bench/trace_digests.py --generated 300 --out /tmp/before.jsonl
    ... change the code ...
    python bench/trace_digests.py --generated 300 --compare /tmp/before.jsonl

Each row: the input, the split, the verdict's signatures, and digests of the cached and the
uncached traces (mambafuzz.store.report.trace_digest: every step record, chunk, write, cache entry and
output).  Exit 1 and one line per difference when --compare finds any.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mambafuzz.checks.pipeline import evaluate  # noqa: E402
from mambafuzz.model.architectures import DEFAULT_MODEL  # noqa: E402
from mambafuzz.model.generate import random_scenario  # noqa: E402
from mambafuzz.model.inputs import decode_input, iter_input_files  # noqa: E402
from mambafuzz.model.scenario import ScenarioError, validate, with_scheduling  # noqa: E402
from mambafuzz.store.corpus import iter_cases  # noqa: E402
from mambafuzz.store.report import trace_digest  # noqa: E402


def inputs(generated: int, continuations: bool = False):
    """The corpus and `generated` random scenarios, drawn without the generator's load burst and every
    late draw after it (generate.LATE_DRAWS: they revise earlier fields only where they fire): the
    scenarios a tree before them drew."""
    from mambafuzz.model import generate

    with generate.late_draws_left_out("_draw_load_burst"):
        yield from _inputs(generated, continuations)


def _inputs(generated: int, continuations: bool = False):
    dirs = [ROOT / "corpus" / d for d in ("seeds", "regressions", "upstream")]
    for case in iter_cases([d for d in dirs if d.exists()], warn=lambda msg: None):
        yield str(case.path.relative_to(ROOT)), case.scenario
    for path, data in iter_input_files([ROOT / "corpus" / "generated"], {}):
        s = decode_input(data)
        if s is not None:  # byte inputs decode through the generator too: the model is its last draw
            s = _before_models(s)
            yield str(path.relative_to(ROOT)), s if continuations else _without_continuations(s)
    rng = random.Random(20261201)
    made = 0
    while made < generated:
        seed = rng.getrandbits(63)
        # the generator draws engine.model after every other field: set back to the default, the scenario
        # is the one a tree before the knob drew for this seed (the new models are new behaviour, not a change)
        s = _before_models(random_scenario(random.Random(seed)))
        if not validate(s):
            made += 1
            yield f"random:{seed}", s if continuations else _without_continuations(s)


def _without_continuations(s):
    """`s` with every continuation link dropped: the generator draws links last and changes no other
    dimension, so this is the scenario a tree from before continuations drew for the same input."""
    for r in s.requests:
        r.continues = r.continue_outputs = None
    return s


def _before_models(s):
    """`s` on the default model, under vLLM's FCFS policy with no priorities, no prefix-cache resets and a
    connector that neither defers nor fails a sync load: the generator draws the model after the fields
    before it, and the priorities, the connector's answers and the resets after every other field."""
    s.engine.model = DEFAULT_MODEL
    s.engine.scheduling_policy = "fcfs"
    s.engine.connector_failed_sync_load = 0  # the connector's answers: drawn after every other field
    for r in s.requests:
        r.priority = 0
        r.connector_defer = 0
    s.prefix_cache_resets = []
    return s


def _before_async(s):
    """`s` without the dimensions the async-scheduling work added (synchronous, aborts at the input
    queue): what a tree from before them ran for the same generated input."""
    s = with_scheduling(s, "sync")
    for r in s.requests:
        r.abort_in_flight = False
    return s


def rows(generated: int, splits: list[str], scheduling: str | None = None, before_async: bool = False,
         continuations: bool = False):
    for name, scenario in inputs(generated, continuations):
        try:
            scenario = _before_async(scenario) if before_async else with_scheduling(scenario, scheduling)
        except ScenarioError as exc:  # a mode the scenario cannot run in (pipeline stages need async)
            for split in splits:
                yield {"input": name, "split": split, "rejected": "; ".join(exc.problems)}
            continue
        for split in splits:
            try:
                ev = evaluate(scenario, split, efficiency=False)
            except ScenarioError as exc:
                yield {"input": name, "split": split, "rejected": "; ".join(exc.problems)}
                continue
            yield {"input": name, "split": split,
                   "signatures": [f.signature for f in ev.verdict.findings],
                   "cached": trace_digest(ev.trace), "uncached": trace_digest(ev.uncached) if ev.uncached else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generated", type=int, default=300, help="generated scenarios beside the corpus (default 300)")
    p.add_argument("--splits", nargs="+", default=["fixed", "prefix"])
    p.add_argument("--scheduling", choices=("sync", "async", "default"), default=None,
                   help="run every input in this scheduling mode")
    p.add_argument("--before-async", action="store_true",
                   help="run every input synchronously with aborts at the input queue: compare with a tree from "
                        "before engine.async_scheduling and abort_in_flight, whose generator drew the same "
                        "scenarios without them")
    p.add_argument("--continuations", action="store_true",
                   help="keep the continuation links the generator draws (last) in the generated scenarios; without "
                        "it they are dropped, so rows compare with a tree from before RequestSpec.continues")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", type=Path, help="write the rows here (JSON lines)")
    g.add_argument("--compare", type=Path, help="compare against rows written before")
    args = p.parse_args()
    if args.generated < 0:
        print("trace_digests: --generated must not be negative", file=sys.stderr)
        return 2
    got = list(rows(args.generated, args.splits, args.scheduling, args.before_async, args.continuations))
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in got))
        print(f"trace_digests: {len(got)} evaluations written to {args.out}")
        return 0
    try:
        before = [json.loads(line) for line in args.compare.read_text().splitlines()]
    except (OSError, ValueError) as exc:
        print(f"trace_digests: cannot read {args.compare}: {exc}", file=sys.stderr)
        return 2
    old = {(r["input"], r["split"]): r for r in before}
    diffs = [f"{r['input']} [{r['split']}]: before {old.get((r['input'], r['split']))}, now {r}"
             for r in got if (r["input"], r["split"]) in old and old[(r["input"], r["split"])] != r]
    missing = len(set(old) - {(r["input"], r["split"]) for r in got})
    new = sum((r["input"], r["split"]) not in old for r in got)  # inputs added since (new seeds): no before to differ from
    for line in diffs:
        print(line)
    print(f"trace_digests: {len(got)} evaluations, {len(diffs)} differ, {missing} missing now, {new} new")
    return 1 if diffs or missing else 0


if __name__ == "__main__":
    sys.exit(main())
