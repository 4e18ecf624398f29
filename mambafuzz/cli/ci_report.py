"""Reports for the CI jobs: pr-fuzz summary (JSON + SARIF), coverage-over-time PNG, and
per-function coverage figures from a coverage.py JSON report.

    python -m mambafuzz.cli.ci_report summarize FINDINGS_DIR... OUT_DIR --split S
    python -m mambafuzz.cli.ci_report plot STATS_CSV... --out PNG
    python -m mambafuzz.cli.ci_report functions COVERAGE_JSON
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from mambafuzz.search import pr
from mambafuzz.store import explanations
from mambafuzz.store.corpus import PRE_EXISTING, atomic_write

FUNCTIONS_OF_INTEREST = ("Scheduler._mamba_block_aligned_split",)
CLASSES_OF_INTEREST = ("MambaManager",)


def _items(directory: Path) -> list[dict]:
    items = []
    for p in sorted(directory.glob("*.json")):
        try:
            meta = json.loads(p.read_text()).get("finding", {})
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(meta, dict) or not meta.get("signature"):
            continue
        items.append({"file": str(p), "signature": meta.get("signature"), "kind": meta.get("kind"),
                      "fine_signature": meta.get("fine_signature") or meta.get("signature"),
                      "message": meta.get("message"), "reproduced": meta.get("reproduced"),
                      "flaky": bool(meta.get("flaky")), "repro": meta.get("repro"),
                      "known": (meta.get("attribution") or {}).get("known") or [],
                      "explained_by": explanations.explained_by(meta), "engine": explanations.engine_label(meta, p),
                      "base": meta.get("base"),
                      # the fuzz target whose judge filed it: the PR job runs both (ci/pr-fuzz)
                      "target": (meta.get("origin") or {}).get("target") or "scheduler"})
    return items


def _groups(findings: Path, new: list[dict]) -> list[dict]:
    """The campaign's root-cause groups (FINDINGS/root-causes.jsonl) of the new findings; a finding the
    file does not name (or no file) is a group of its own."""
    files = {Path(i["file"]).name: i["file"] for i in new}  # the campaign may have named them from elsewhere
    groups = [{"root": files[Path(g["root"]).name],
               "members": [dict(m, path=files[Path(m["path"]).name]) for m in g["members"]],
               **({"cause": g["cause"]} if g.get("cause") else {})}
              for g in pr.read_groups(findings) or []
              if g.get("members") and all(Path(m["path"]).name in files for m in g["members"])]
    named = {m["path"] for g in groups for m in g["members"]}
    return groups + [{"root": i["file"], "members": [{"path": i["file"], "signature": i["signature"],
                                                      "fine_signature": i["fine_signature"], "why": "root"}]}
                     for i in new if i["file"] not in named]


def _result(item: dict, level: str, text: str, related: list[dict] = (), one_cause: bool = False) -> dict:
    engine = item["engine"]
    out = {"ruleId": item["kind"], "level": level,
           "message": {"text": f"[{item['target']} target] {text}" + explanations.tag(engine)},
           "locations": [{"physicalLocation": {"artifactLocation": {"uri": item["file"]}}}],
           "partialFingerprints": {"signature": item["signature"]},
           "properties": {"target": item["target"], "explained_by": item["explained_by"],
                          "real_engine_builds": engine["real_engine_builds"], "engine_notes": engine["notes"]}}
    if related:
        out["relatedLocations"] = [{"id": n, "physicalLocation": {"artifactLocation": {"uri": m["path"]}},
                                    "message": {"text": m.get("text") or (
                                        f"{m['fine_signature']} (grouped with the first, {m['why']}"
                                        + ("; the same change)" if one_cause else "; may be another cause)"))}}
                                   for n, m in enumerate(related, 1)]
    return out


def summarize(findings: Path | list[Path], out: Path, split: str) -> dict:
    """summary.json and findings.sarif: new findings by group of shared symptoms (one SARIF result per group,
    its other members as related locations), flaky ones, and pre-existing ones (the PR's base
    shows them too: a SARIF note, labelled by the known fixes, not failing the job). Several
    findings directories (one per fuzz target, as the PR job keeps them) make one summary; each
    finding says which target filed it."""
    dirs = [findings] if isinstance(findings, Path) else list(findings)
    items, pre, groups = [], [], []
    for d in dirs:
        here = _items(d)
        items += here
        pre += _items(d / PRE_EXISTING)
        groups += _groups(d, [i for i in here if not i["flaky"]])
    new = [i for i in items if not i["flaky"]]
    by_file = {i["file"]: i for i in new}
    targets: dict[str, int] = {}
    for i in new:
        targets[i["target"]] = targets.get(i["target"], 0) + 1
    pre_groups = explanations.by_explanation(pre)
    summary = {"split": split, "new_findings": new, "flaky": [i for i in items if i["flaky"]],
               "groups": groups, "pre_existing": pre, "pre_existing_by_explanation": pre_groups,
               "new_by_target": targets}
    atomic_write(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    results = []
    for g in groups:
        root = by_file[g["root"]]
        n = len(g["members"])
        results.append(_result(root, "error", f"{root['message']} (replay: {root['repro']})"
                               + (f"; {n} findings, one root cause ({g['cause']})" if n > 1 and g.get("cause") else
                                  f"; {n} findings, one group of shared symptoms" if n > 1 else ""), g["members"][1:],
                               bool(g.get("cause"))))
    results += [_result(i, "warning", f"flaky: {i['message']} (replay: {i['repro']})") for i in summary["flaky"]]
    by_file_pre = {i["file"]: i for i in pre}
    for g in pre_groups:  # one note per cause the base shows too, its other findings as related locations
        first = by_file_pre[g["files"][0]]
        results.append(_result(first, "note", f"pre-existing (the base shows it too), {g['count']} finding(s) "
                                              f"explained by: {g['explained_by']}; first: {first['message']}",
                               [{"path": f, "text": f"{by_file_pre[f]['fine_signature']} (pre-existing, the same "
                                                    f"explanation: {g['explained_by']})"} for f in g["files"][1:]]))
    sarif = {
        "version": "2.1.0",
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "runs": [{
            "tool": {"driver": {"name": "mambafuzz", "rules": [
                {"id": k, "shortDescription": {"text": k.replace("_", " ")}}
                for k in sorted({i["kind"] for i in items + pre if i["kind"]})]}},
            "results": results,
        }],
    }
    atomic_write(out / "findings.sarif", json.dumps(sarif, indent=1) + "\n")
    return summary


def plot(stats_files: list[Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    ax2 = ax.twinx()
    for f in stats_files:
        rows = list(csv.DictReader(f.open()))
        xs = [float(r["seconds"]) / 60 for r in rows if r["coverage"]]
        cov = [int(r["coverage"]) for r in rows if r["coverage"]]
        if xs:
            ax.plot(xs, cov, label=f"coverage ({f.parent.name})", linewidth=2)
        xe = [float(r["seconds"]) / 60 for r in rows]
        ax2.plot(xe, [int(r["execs"]) for r in rows], linestyle="--", alpha=0.5, label=f"executions ({f.parent.name})")
    ax.set_xlabel("fuzzing time (minutes)")
    ax.set_ylabel("libFuzzer coverage (edges)")
    ax2.set_ylabel("executions")
    ax.set_title("mambafuzz: coverage of vLLM scheduling / KV-cache code over time")
    ax.grid(alpha=0.3)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="lower right", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)


def functions(coverage_json: Path) -> list[str]:
    data = json.loads(coverage_json.read_text())
    lines = []
    for fname, fdata in data["files"].items():
        for kind, wanted in (("functions", FUNCTIONS_OF_INTEREST), ("classes", CLASSES_OF_INTEREST)):
            for name, region in fdata.get(kind, {}).items():
                if name in wanted:
                    s = region["summary"]
                    branches = (f", branches {s['covered_branches']}/{s['num_branches']}"
                                if "num_branches" in s else "")
                    lines.append(f"{name} ({fname.split('site-packages/')[-1]}): lines {s['covered_lines']}/"
                                 f"{s['num_statements']} = {s['percent_covered_display']}%{branches}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mambafuzz.cli.ci_report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("findings", nargs="+", help="findings directories, then the output directory")
    s.add_argument("--split", default="fixed")
    s.add_argument("--job", default="pr-fuzz", help="the CI job named in the one-line result (default pr-fuzz)")
    pl = sub.add_parser("plot")
    pl.add_argument("stats", nargs="+")
    pl.add_argument("--out", required=True)
    fn = sub.add_parser("functions")
    fn.add_argument("coverage_json")
    args = p.parse_args(argv)
    if args.cmd == "summarize":
        if len(args.findings) < 2:
            p.error("summarize: give FINDINGS_DIR... OUT_DIR")
        *dirs, out = args.findings
        summary = summarize([Path(d) for d in dirs], Path(out), args.split)
        print(f"{args.job}: {len(summary['new_findings'])} new finding(s) in {len(summary['groups'])} "
              f"group(s), {len(summary['flaky'])} flaky, {len(summary['pre_existing'])} pre-existing")
        for g in summary["groups"]:
            root = next(i for i in summary["new_findings"] if i["file"] == g["root"])
            explained = root["explained_by"]
            print(f"  NEW [{root['target']}] {root['fine_signature']}: {root['repro']}"
                  + (f" (+{len(g['members']) - 1} more in this group)" if len(g["members"]) > 1 else "")
                  + (f" [{explained}]" if explained != explanations.NO_EXPLANATION else "")
                  + explanations.tag(root["engine"]))
        for g in summary["pre_existing_by_explanation"]:
            print(f"  pre-existing {explanations.group_line(g)}")
    elif args.cmd == "plot":
        files = [Path(f) for f in args.stats if Path(f).exists()]
        if not files:
            print("plot: no stats files", file=sys.stderr)
            return 2
        plot(files, Path(args.out))
        print(f"wrote {args.out}")
    else:
        for line in functions(Path(args.coverage_json)):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
