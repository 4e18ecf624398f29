"""The fuzzing subcommands of `mambafuzz`: fuzz, minimize,
corpus {merge,prune,stats,add-regression,confirm-engine}."""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from mambafuzz.cli.options import SPLIT_HELP, add_patch_argument, add_runner_argument, either, patches_or_usage
from mambafuzz.exit_codes import EXIT_CLEAN, EXIT_FOUND, EXIT_TOOL, EXIT_USAGE, UsageError, one_line
from mambafuzz.search import fuzz_targets, generators

DEFAULT_KNOWN = ["corpus/regressions", "corpus/upstream"]
DEFAULT_SEEDS = ["corpus/seeds"]
DEFAULT_UNTRIAGED = "corpus/untriaged"  # candidate fixes of open findings: they label, never drop
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # where the corpus lives in a checkout
CONFIRM_HELP = ("Re-run the minimized finding on a real vLLM engine (CPU backend, `mambafuzz engine-repro`) and "
                "record diverged/agreed/crashed/skipped (with the reason) as finding.engine_confirmation.")


def add_commands(sub) -> None:
    f = sub.add_parser(
        "fuzz", help="search the scenario space and file minimized findings",
        description="Generate scenarios (atheris/libFuzzer with coverage from vLLM's scheduling and KV-cache "
                    "modules, Hypothesis' decoder under the same feedback, or plain random), run each through "
                    "vLLM's real scheduler and the oracles, and file every new violation once, minimized, as a "
                    "scenario file that `mambafuzz repro` replays. Extra libFuzzer flags go after `--`. "
                    "Exit 1 if anything new was found, 0 if not, 2 on usage errors, 3 when the campaign did not "
                    "really run (a worker could not start or died, or no input was executed).")
    f.add_argument("--target", choices=fuzz_targets.names(), default="scheduler", help=fuzz_targets.help_text())
    f.add_argument("--split", default="fixed", help=SPLIT_HELP)
    f.add_argument("--generator", "--engine", dest="generator", choices=generators.names(), default=generators.DEFAULT,
                   help=f"what generates inputs: {either({g.name: g.description for g in generators.GENERATORS.values()})}; "
                        f"default {generators.DEFAULT}, the best attributed time to bug in bench/mutation_score.py "
                        "(README, 'Mutation testing'). --engine is the old name")
    add_runner_argument(f)
    f.add_argument("--scheduling", choices=("sync", "async", "default"), default=None,
                   help="run every scenario with this scheduler and engine-core loop (sync, async, or default: "
                        "vLLM's pick on a CUDA host); default: each generated scenario's own draw, which covers "
                        "both modes")
    f.add_argument("--max-time", type=float, default=60.0, metavar="SECONDS", help="stop after this long (default 60)")
    f.add_argument("--runs", type=int, default=0, metavar="N", help="stop after N executions (0: no limit)")
    f.add_argument("--jobs", type=int, default=1, metavar="N", help="parallel workers sharing corpus and findings")
    f.add_argument("--seed", type=int, default=1, metavar="N", help="PRNG seed (default 1)")
    f.add_argument("--corpus", default="corpus/generated", metavar="DIR",
                   help="read inputs from here and write new-coverage inputs back (default corpus/generated)")
    f.add_argument("--seeds", nargs="*", default=DEFAULT_SEEDS, metavar="DIR",
                   help="read-only seed directories (default corpus/seeds)")
    f.add_argument("--findings", default="findings", metavar="DIR", help="where findings are filed (default findings)")
    f.add_argument("--known", nargs="*", default=DEFAULT_KNOWN, metavar="DIR",
                   help="cases whose signatures are not new (default corpus/regressions corpus/upstream)")
    f.add_argument("--stop-on-first", action="store_true", help="stop at the first new finding")
    f.add_argument("--base", metavar="VLLM", default=None,
                   help="PR mode: judge every violation against this base vLLM, 'installed' (this environment's "
                        "vLLM without PYTHONPATH overlays or a planted mutant) or a directory made by ci/pr-overlay; "
                        "a violation the base shows too is recorded under FINDINGS/pre-existing/, labelled by the "
                        "known fixes, and is not new; known fixes then label findings and drop none; with --target "
                        "conform, a disagreement the base's worker code shows too is the pre-existing one")
    f.add_argument("--allow-efficiency", nargs="+", default=[], metavar="FIGURE", choices=("hits", "steps", "blocks"),
                   help="with --base: figures the efficiency gate lets regress against the base (hits: prefix-hit "
                        "tokens served, steps: forward steps, blocks: peak blocks in use). Without it every input "
                        "also runs on the base, and fewer hits, more steps or more peak blocks than the base's is "
                        "a finding, efficiency_regression")
    f.add_argument("--with-known-fixes", action="store_true",
                   help="run every input on vLLM plus the candidate fix of every known bug under --known, so what "
                        "is found is what those fixes leave (a fix that no longer applies is named and skipped)")
    add_patch_argument(f)
    f.add_argument("--minimize-budget", type=float, default=30.0, metavar="SECONDS",
                   help="time allowed to minimize each finding (default 30)")
    f.add_argument("--rss-limit-mb", type=int, default=4096, metavar="MB",
                   help="stop a worker whose RSS exceeds this, like libFuzzer's -rss_limit_mb (default 4096)")
    f.add_argument("--quiet", action="store_true", help="no periodic status lines")
    f.add_argument("--stats", metavar="CSV", help="keep the status lines as CSV (seconds,execs,coverage,corpus,"
                                                  "findings), appended across runs: the coverage-over-time data")
    f.add_argument("--confirm-engine", action="store_true", help=CONFIRM_HELP + " After the campaign, for every "
                   "minimized finding it filed (not flaky ones; skipped after Ctrl-C).")
    f.add_argument("libfuzzer_args", nargs="*", metavar="-- LIBFUZZER_FLAG",
                   help="passed to libFuzzer unchanged (the generators that run under it: "
                        f"{', '.join(g.name for g in generators.GENERATORS.values() if g.launch is generators.libfuzzer)})")
    f.set_defaults(handler=cmd_fuzz)

    m = sub.add_parser("minimize", help="shrink a failing scenario file, keeping its signature",
                       description="Minimize FILE while it still fails with the same signature under --split; "
                                   "writes FILE's name with .min.json (or -o). Exit 1 when FILE fails (and was "
                                   "minimized), 0 when it is clean, 2 on bad input.")
    m.add_argument("file", metavar="FILE")
    m.add_argument("--split", default="fixed", help=SPLIT_HELP)
    add_runner_argument(m)
    m.add_argument("-o", "--output", metavar="OUT")
    m.add_argument("--budget", type=float, default=60.0, metavar="SECONDS")
    add_patch_argument(m)
    m.add_argument("--confirm-engine", action="store_true", help=CONFIRM_HELP)
    m.set_defaults(handler=cmd_minimize)

    c = sub.add_parser("corpus", help="merge, prune, inspect or extend corpora")
    csub = c.add_subparsers(dest="corpus_command", metavar="ACTION")
    csub.required = True
    cm = csub.add_parser("merge", help="copy inputs from SRC that add vLLM branch coverage to DEST")
    cm.add_argument("dest", metavar="DEST")
    cm.add_argument("sources", nargs="+", metavar="SRC")
    cm.set_defaults(handler=cmd_corpus_merge)
    cp = csub.add_parser("prune", help="delete inputs of DIR that add no coverage over the others")
    cp.add_argument("dir", metavar="DIR")
    cp.add_argument("--dry-run", action="store_true")
    cp.set_defaults(handler=cmd_corpus_prune)
    cs = csub.add_parser("stats", help="sizes, coverage and per-dimension histograms")
    cs.add_argument("dirs", nargs="+", metavar="DIR")
    cs.add_argument("--no-coverage", action="store_true", help="skip the coverage measurement")
    cs.set_defaults(handler=cmd_corpus_stats)
    ca = csub.add_parser("add-regression", help="add a (minimized) finding as a regression case",
                         description="Replay FILE under fixed, prefix and realign, and write it to "
                                     "corpus/regressions/ with that expected-verdict table.")
    ca.add_argument("file", metavar="FILE")
    ca.add_argument("--name", help="file name in corpus/regressions (default: FILE's name)")
    ca.add_argument("--dir", default="corpus/regressions")
    ca.add_argument("--splits", nargs="+", default=["fixed", "prefix", "realign"])
    ca.set_defaults(handler=cmd_corpus_add_regression)
    ce = csub.add_parser(
        "confirm-engine", help="record in each case whether a real vLLM engine confirms it",
        description="Replay every case under PATH (files, or directories walked for *.json) on the engine tier "
                    "(`mambafuzz engine-repro`: a real CPU vLLM engine, prefix caching on under the split vs "
                    "off) and write the verdict into the file: finding.engine_confirmation for cases with a "
                    "finding block (under the finding's split), else a top-level engine_confirmation keyed by "
                    "each split of the case's expected table. Status diverged, agreed, crashed, or skipped with "
                    "the reason the CPU engine cannot run it. Files are rewritten atomically. Exit 1 if any case "
                    "diverged or crashed the engine, 2 on bad input (bad files are named and left alone).")
    ce.add_argument("paths", nargs="+", metavar="DIR_OR_FILE")
    ce.add_argument("--split", default=None, help="confirm under this split only (default: each case's own; "
                                                  + SPLIT_HELP + ")")
    ce.set_defaults(handler=cmd_corpus_confirm_engine)


def _usage(msg: str) -> UsageError:
    return UsageError(msg)


def input_dirs(given: list[str], defaults: list[str], flag: str, consequence: str) -> list[Path]:
    """Directories a fuzz run reads.  A directory named on the command line must exist.  The
    defaults are relative to the project: from another working directory they are found in
    the checkout this package runs from, and a warning says what is lost when they are not."""
    if given is not defaults:
        missing = [d for d in given if not Path(d).is_dir()]
        if missing:
            raise _usage(f"{flag} {missing[0]}: no such directory")
        return [Path(d) for d in given]
    found = []
    for d in defaults:
        for candidate in (Path(d), PROJECT_ROOT / d):
            if candidate.is_dir():
                found.append(candidate)
                break
        else:
            print(f"warning: {flag} default {d} not found here or in {PROJECT_ROOT}: {consequence}", file=sys.stderr)
    return found


def cmd_fuzz(args: argparse.Namespace) -> int:
    from mambafuzz.search.pr import GROUPS_FILE, check_where, group_findings
    from mambafuzz.search.supervisor import CampaignConfig, finding_meta, run_campaign
    from mambafuzz.sim.bridge.vllm_compat.resolve import check_all
    from mambafuzz.sim.engine import splits
    from mambafuzz.store import explanations

    # --target conform: Triton's CPU shim is on already (cli.main's start-up step), before check_all
    # imports vLLM's kernel modules, since a --patch checked here may name a conformance module
    check_all()  # an unsupported vLLM: one line and exit 3 here, not workers that die silently
    try:
        splits.resolve(args.split)
    except splits.SplitError as exc:
        raise _usage(str(exc)) from None
    for name, value in (("--max-time", args.max_time), ("--runs", args.runs), ("--minimize-budget", args.minimize_budget)):
        if value < 0:
            raise _usage(f"{name} must not be negative")
    if args.jobs < 1:
        raise _usage("--jobs must be at least 1")
    target = fuzz_targets.get(args.target)
    refused = target.usage_error(args)
    if refused:
        raise _usage(refused)
    base = None
    if args.base is not None:
        base = check_where(args.base)
    elif args.allow_efficiency:
        raise _usage("--allow-efficiency applies only with --base (the gate compares against the base)")
    if not args.max_time and not args.runs:
        raise _usage("give --max-time or --runs (a run needs a bound)")
    generator = generators.get(args.generator)
    if not generator.drives(args.target):
        raise _usage(f"--generator {generator.name} cannot drive --target {args.target} "
                     f"(it drives {', '.join(generator.targets or ())})")
    if generator.needs_atheris:
        try:
            import atheris  # noqa: F401
        except ImportError:
            raise _usage(f"--generator {generator.name} needs atheris (pip install atheris==3.0.0)") from None
    for d in [args.corpus, args.findings]:
        if Path(d).exists() and not Path(d).is_dir():
            raise _usage(f"{d} exists and is not a directory")
    seed_dirs = input_dirs(args.seeds, DEFAULT_SEEDS, "--seeds", "the run starts without seeds")
    known_dirs = input_dirs(args.known, DEFAULT_KNOWN, "--known",
                             "known upstream behaviours and regressions will be filed as new findings")
    patch_specs, known_fix_dirs = _worker_patches(args, known_dirs)
    cfg = CampaignConfig(
        generator=args.generator, split=args.split, max_time=args.max_time, runs=args.runs, jobs=args.jobs, seed=args.seed,
        corpus=Path(args.corpus), seed_dirs=seed_dirs, findings=Path(args.findings),
        known_dirs=known_dirs, stop_on_first=args.stop_on_first,
        minimize_budget=args.minimize_budget, rss_limit_mb=args.rss_limit_mb,
        libfuzzer_args=list(args.libfuzzer_args), quiet=args.quiet,
        stats_file=Path(args.stats) if args.stats else None, patches=patch_specs, known_fix_dirs=known_fix_dirs,
        runner=args.runner, target=args.target, scheduling=args.scheduling, base=base,
        efficiency_allowed=list(args.allow_efficiency),
        untriaged_dirs=[d for d in (Path(DEFAULT_UNTRIAGED), PROJECT_ROOT / DEFAULT_UNTRIAGED) if d.is_dir()][:1])
    print(f"fuzzing {target.describe(args)} with {args.generator} x{args.jobs} under {sys.executable}, "
          f"findings in {args.findings}/", flush=True)
    result = run_campaign(cfg)
    real = [p for p in result.new_files if not p.name.startswith("flaky-")]
    groups = (group_findings(real, args.split, Path(args.findings), patch_specs, known_fix_dirs,
                             replay=not result.interrupted, base=base if target.groups_against_base else None)
              if real else [])
    print(f"\nsummary: {result.execs} executions in {result.seconds:.1f}s, {len(real)} new finding(s)"
          + ((" in 1 group: the PR's one change" if groups[0].get("cause") else
              f" in {len(groups)} group(s) of shared symptoms") if groups else "")
          + (f", {len(result.new_files) - len(real)} flaky" if len(result.new_files) > len(real) else "")
          + (f", {result.tool_errors} tool failure(s)" if result.tool_errors else "")
          + (" (interrupted)" if result.interrupted else ""))
    if any(result.modes.values()):
        print("  scheduling: " + ", ".join(f"{n} {mode}" for mode, n in sorted(result.modes.items())))
    if result.row_classes:
        _print_row_classes(result.row_classes)
    if groups and groups[0].get("cause"):
        print(f"groups ({groups[0]['cause']}: every new finding needs it, so one root cause; every member kept; "
              f"{Path(args.findings) / GROUPS_FILE}):")
    elif groups:
        print(f"groups (shared symptoms; a group may hold more than one cause; every member kept; "
              f"{Path(args.findings) / GROUPS_FILE}):")
    for i, g in enumerate(groups, 1):
        root = Path(g["root"])
        meta = finding_meta(root)
        first_diff = g["members"][0].get("divergence")
        label = explanations.labels(root)
        explained = label["explained_by"]
        print(f"  group {i}: {meta.get('fine_signature', '?')}  reproduced {meta.get('reproduced', '?')}  {root}"
              + (f"  (first differs from the base at {first_diff})" if first_diff else "")
              + (f"  [{explained}]" if explained != explanations.NO_EXPLANATION else "")
              + explanations.tag(label["engine"]))
        print(f"    repro: {meta.get('repro') or f'mambafuzz repro {root} --split {args.split}'}")
        for m in g["members"][1:]:
            print(f"    + {m['fine_signature']} [{m['why']}]  {m['path']}")
    for p in result.new_files:
        if p not in real:
            print(f"  flaky: {finding_meta(p).get('signature', '?')}  reproduced {finding_meta(p).get('reproduced')}  {p}")
    if result.pre_existing:
        print(f"{len(result.pre_existing)} pre-existing (the base {args.base} shows them too; not new), "
              f"by what explains them:")
        for g in explanations.by_explanation([explanations.labels(p) for p in result.pre_existing]):
            print(f"  {explanations.group_line(g)}")
    if args.confirm_engine:
        to_confirm = [p for p in real if p.exists()]
        if result.interrupted and to_confirm:
            print(f"engine confirmation skipped (interrupted); later: mambafuzz corpus confirm-engine "
                  f"{' '.join(str(p) for p in to_confirm)}")
        elif to_confirm:
            _confirm_engine(to_confirm, None)
    for problem in result.problems:
        print(f"mambafuzz: {problem}", file=sys.stderr)
    if result.problems:
        for line in result.log_tail[-15:]:
            print(f"  | {line}", file=sys.stderr)
        if not real:  # a finding is real whatever else went wrong; nothing else passes
            ran = len(result.problems) == 1 and result.tool_errors  # its one problem: inputs it failed on
            what = "mambafuzz failed on some inputs" if ran else "the campaign did not really run"
            print(f"mambafuzz: {what} (a tool failure, not a clean result)", file=sys.stderr)
            return EXIT_TOOL
    return EXIT_FOUND if real else EXIT_CLEAN


def _print_row_classes(counts: dict[str, dict[str, int]]) -> None:
    """The conform target's row classes: inputs reaching each, per runner, and the classes none reached."""
    from mambafuzz.conform.row_classes import ALL_CLASSES, ClassCoverage

    cov = ClassCoverage.merged([counts])
    runners = sorted(cov.inputs)
    print("  row classes (inputs reaching each; mambafuzz/conform/row_classes.py): " + cov.line())
    for c in ALL_CLASSES:
        print(f"    {c:40} " + "  ".join(f"{r} {cov.inputs[r].get(c, 0):>6}" for r in runners))
    for r in runners:
        if cov.missing(r):
            print(f"  not reached on {r}: {', '.join(cov.missing(r))}")


def _worker_patches(args: argparse.Namespace, known_dirs: list[Path]) -> tuple[list[str], list[str]]:
    """(--patch specs, --with-known-fixes directories) for the workers' configuration, checked
    here once so that a bad one is a usage error, not a failure in every worker."""
    from mambafuzz.store.known_bugs import known_fix_bugs

    patches_or_usage(args.patch)
    specs = [str(Path(p).resolve()) if p.endswith(".py") else p for p in args.patch]
    fix_dirs: list[str] = []
    if args.with_known_fixes:
        for bug in known_fix_bugs(known_dirs):  # name them once here; every worker applies the usable ones
            state = "applied" if bug.fix_error is None else f"SKIPPED, does not apply: {bug.fix_error}"
            print(f"with known fix {bug.name}: {state}", flush=True)
        fix_dirs = [str(d.resolve()) for d in known_dirs]
    return specs, fix_dirs


def cmd_minimize(args: argparse.Namespace) -> int:
    from mambafuzz.checks.pipeline import evaluate, same_signature
    from mambafuzz.model.scenario import ScenarioError, with_runner
    from mambafuzz.search.minimizer import minimize
    from mambafuzz.sim.engine import splits
    from mambafuzz.store import corpus
    from mambafuzz.store.corpus import atomic_write, case_json

    patches = patches_or_usage(args.patch)
    try:
        splits.resolve(args.split)
        case = corpus.load_case(args.file)
        case.scenario = with_runner(case.scenario, args.runner)  # the minimized file keeps it
        first = evaluate(case.scenario, args.split, efficiency=False, patches=patches).verdict
    except (splits.SplitError, corpus.CaseError, ScenarioError) as exc:
        raise _usage(str(exc)) from None
    if first.clean:
        print(f"{args.file} [split {args.split}]: clean, nothing to minimize")
        return EXIT_CLEAN
    sig = first.primary.signature

    def still_fails(s) -> bool:
        return same_signature(s, args.split, sig, patches)

    out = Path(args.output) if args.output else Path(args.file).with_suffix(".min.json")
    print(f"minimizing {args.file} ({sig}), size {case.scenario.size()}", flush=True)
    result = minimize(case.scenario, still_fails, time_budget=args.budget)
    final = evaluate(result.scenario, args.split, efficiency=False, patches=patches).verdict  # its message names its own chunks
    message = final.primary.message if not final.clean else first.primary.message
    meta = dict(case.extra.get("finding", {}) or {}, signature=sig, split=args.split, message=message,
                repro=f"mambafuzz repro {out} --split {args.split}")
    meta.pop(corpus.ENGINE_CONFIRMATION, None)  # it was about the scenario before minimization
    atomic_write(out, case_json(result.scenario, case.expected or None, note=case.extra.get("note"), finding=meta))
    print(f"wrote {out}: size {result.scenario.size()} (requests, last step, tokens) after {result.attempts} "
          f"attempts in {result.seconds:.1f}s{' (budget reached)' if result.timed_out else ''}")
    if args.confirm_engine:
        _confirm_engine([out], args.split)
    return EXIT_FOUND


def _confirm_engine(paths: list[Path], split: str | None) -> tuple[int, int]:
    """Confirm each file on the engine tier, one status line each; (diverged or crashed, errors).
    A file that cannot be confirmed is named on stderr and left as it was."""
    from mambafuzz.engine_tier.confirmation import confirm_file
    from mambafuzz.model.scenario import ScenarioError
    from mambafuzz.sim.engine import splits
    from mambafuzz.store.corpus import CaseError

    found = errors = 0
    for i, path in enumerate(paths):
        try:
            records = confirm_file(path, split, announce=lambda line: print(line, flush=True))
        except (CaseError, ScenarioError, splits.SplitError) as exc:
            problem = "; ".join(exc.problems) if isinstance(exc, ScenarioError) else str(exc)
            print(f"mambafuzz: {problem if str(path) in problem else f'{path}: {problem}'}", file=sys.stderr)
            errors += 1
            continue
        except Exception as exc:  # noqa: BLE001 - a tool failure on one file must not lose the others
            print(f"mambafuzz: {path}: engine confirmation failed: {one_line(exc)}", file=sys.stderr)
            errors += 1
            continue
        except KeyboardInterrupt:
            left = [str(p) for p in paths[i:]]
            print(f"engine confirmation interrupted; {len(left)} file(s) left as they were: "
                  f"mambafuzz corpus confirm-engine {' '.join(left)}", file=sys.stderr)
            raise
        found += any(r["status"] in ("diverged", "crashed") for r in records)
    return found, errors


def _load_inputs(dirs, must_exist: bool = True):
    from mambafuzz.model.inputs import decode_input, iter_input_files

    missing = [d for d in dirs if must_exist and not Path(d).exists()]
    if missing:
        raise _usage(f"{missing[0]}: no such file or directory")
    stats: dict = {}
    items = []
    for path, data in iter_input_files([Path(d) for d in dirs], stats):
        scenario = decode_input(data)
        if scenario is None:
            print(f"warning: {path}: skipped, does not decode to a valid scenario", file=sys.stderr)
            stats["skipped"] += 1
            continue
        items.append((path, data, scenario))
    return items, stats


def cmd_corpus_merge(args: argparse.Namespace) -> int:
    from mambafuzz.search.coverage_map import FeatureTracer
    from mambafuzz.store.corpus import atomic_write, content_name

    tracer = FeatureTracer()
    have: set = set()
    dest_items, _ = _load_inputs([args.dest], must_exist=False)
    for _, _, s in dest_items:
        have |= tracer.features(s)
    src_items, stats = _load_inputs(args.sources)
    src_items.sort(key=lambda item: len(item[1]))
    added = 0
    for _path, data, s in src_items:
        feats = tracer.features(s)
        if feats - have:
            have |= feats
            atomic_write(Path(args.dest) / content_name(data, ".json" if data.lstrip().startswith(b"{") else ""), data)
            added += 1
    print(f"merge: {added} of {len(src_items)} inputs added to {args.dest} ({len(have)} branch arcs; "
          f"{stats['skipped']} skipped)")
    return EXIT_CLEAN


def cmd_corpus_prune(args: argparse.Namespace) -> int:
    from mambafuzz.search.coverage_map import FeatureTracer

    tracer = FeatureTracer()
    items, stats = _load_inputs([args.dir])
    scored = sorted(((tracer.features(s), p, d) for p, d, s in items), key=lambda x: (-len(x[0]), len(x[2])))
    have: set = set()
    drop = []
    for feats, path, _ in scored:
        if feats - have:
            have |= feats
        else:
            drop.append(path)
    for p in drop:
        if not args.dry_run:
            p.unlink()
    verb = "would delete" if args.dry_run else "deleted"
    print(f"prune: kept {len(items) - len(drop)}, {verb} {len(drop)} of {len(items)} ({len(have)} branch arcs; "
          f"{stats['skipped']} skipped)")
    return EXIT_CLEAN


def _histogram(values, buckets) -> str:
    counts = collections.Counter()
    for v in values:
        label = next((f"<={b}" for b in buckets if v <= b), f">{buckets[-1]}")
        counts[label] += 1
    order = [f"<={b}" for b in buckets] + [f">{buckets[-1]}"]
    return "  ".join(f"{k}:{counts[k]}" for k in order if counts[k])


def cmd_corpus_stats(args: argparse.Namespace) -> int:
    items, stats = _load_inputs(args.dirs)
    scen = [s for _, _, s in items]
    print(f"inputs: {len(items)} ({sum(len(d) for _, d, _ in items)} bytes), skipped {stats['skipped']}")
    if not scen:
        return EXIT_CLEAN
    e = [s.engine for s in scen]
    rows = {
        "requests": ([len(s.requests) for s in scen], [1, 2, 3, 4]),
        "prompt tokens": ([s.prompt_len(i) for s in scen for i in range(len(s.requests))], [16, 64, 256, 1024, 4096]),
        "mamba block": ([x.mamba_block_size for x in e], [16, 64, 256, 1024]),
        "budget/block": ([x.max_num_batched_tokens * 4 // x.mamba_block_size for x in e], [1, 2, 4, 8]),
        "match unit": ([x.hash_block_size for x in e], [1, 4, 8, 16, 32]),
        "spec tokens": ([x.num_speculative_tokens for x in e], [0, 1, 2, 3]),
        "connector reqs": ([sum(bool(r.external_tokens) for r in s.requests) for s in scen], [0, 1, 2]),
        "aborts": ([sum(r.abort_step is not None for r in s.requests) for s in scen], [0, 1, 2]),
        "arrival spread": ([s.size()[1] for s in scen], [0, 2, 4, 8]),
        "small pool": ([int(x.num_gpu_blocks is not None) for x in e], [0, 1]),
        "checkpoint blk": ([x.num_prefill_checkpoint_blocks for x in e], [0, 1]),
    }
    for name, (values, buckets) in rows.items():
        print(f"  {name:<15} {_histogram(values, buckets)}")
    if not args.no_coverage:
        from mambafuzz.search.coverage_map import FeatureTracer

        tracer = FeatureTracer()
        total: set = set()
        for s in scen:
            total |= tracer.features(s)
        by_file = collections.Counter(f for f, _, _ in total)
        print(f"coverage: {len(total)} branch arcs in vLLM's scheduling/KV-cache code")
        for f, n in by_file.most_common():
            print(f"  {n:6d}  {f}")
    return EXIT_CLEAN


def cmd_corpus_add_regression(args: argparse.Namespace) -> int:
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.model.scenario import ScenarioError
    from mambafuzz.store import corpus
    from mambafuzz.store.corpus import atomic_write, case_json

    try:
        case = corpus.load_case(args.file)
        verdicts = {s: evaluate(case.scenario, s, efficiency=False).verdict for s in args.splits}
    except (corpus.CaseError, ScenarioError) as exc:
        raise _usage(str(exc)) from None
    expected = {s: v.kind for s, v in verdicts.items()}
    name = args.name or Path(args.file).name
    if not name.endswith(".json"):
        name += ".json"
    out = Path(args.dir) / name
    if out.exists():
        raise _usage(f"{out} already exists; pass --name")
    meta = case.extra.get("finding")
    note = case.extra.get("note") or "; ".join(f"{s}: {v.primary.message if v.primary else 'clean'}"
                                                for s, v in verdicts.items())
    atomic_write(out, case_json(case.scenario, expected, note=note, finding=meta))
    print(f"wrote {out} with expected verdicts {expected}")
    return EXIT_CLEAN


def _case_files(paths: list[str]) -> list[Path]:
    """The *.json case files named by `paths` (directories walked, dot-files and findings'
    raw/ folders skipped), sorted per argument; a missing path is a usage error."""
    out: list[Path] = []
    for arg in paths:
        p = Path(arg)
        if not p.exists():
            raise _usage(f"{arg}: no such file or directory")
        if p.is_dir():
            out += sorted(f for f in p.rglob("*.json") if not f.name.startswith(".") and not f.is_symlink()
                          and "raw" not in f.relative_to(p).parts[:-1] and f.is_file())
        else:
            out.append(p)
    return out


def cmd_corpus_confirm_engine(args: argparse.Namespace) -> int:
    from mambafuzz.sim.engine import splits
    from mambafuzz.store import corpus

    if args.split is not None:
        try:
            splits.resolve(args.split)
        except splits.SplitError as exc:
            raise _usage(str(exc)) from None
    files = _case_files(args.paths)
    good, bad = [], 0
    for p in files:  # every file is checked before an engine is paid for
        try:
            corpus.load_case(p)
            good.append(p)
        except corpus.CaseError as exc:
            print(f"mambafuzz: {exc}", file=sys.stderr)
            bad += 1
    if not files:
        raise _usage(f"no .json case files under {' '.join(args.paths)}")
    found, errors = _confirm_engine(good, args.split)
    print(f"confirm-engine: {len(good) - errors} file(s) recorded, {found} diverged or crashed, "
          f"{bad + errors} unusable")
    if bad or errors:
        return EXIT_USAGE
    return EXIT_FOUND if found else EXIT_CLEAN
