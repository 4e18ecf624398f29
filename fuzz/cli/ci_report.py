"""Reports for the CI jobs: pr-fuzz summary (JSON + SARIF), coverage-over-time PNG, and
per-function coverage figures from a coverage.py JSON report.

    python -m fuzz.cli.ci_report summarize FINDINGS_DIR OUT_DIR --split S
    python -m fuzz.cli.ci_report plot STATS_CSV... --out PNG
    python -m fuzz.cli.ci_report functions COVERAGE_JSON
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from fuzz.store.corpus import atomic_write

FUNCTIONS_OF_INTEREST = ("Scheduler._mamba_block_aligned_split",)
CLASSES_OF_INTEREST = ("MambaManager",)


def summarize(findings: Path, out: Path, split: str) -> dict:
    items = []
    for p in sorted(findings.glob("*.json")):
        try:
            meta = json.loads(p.read_text()).get("finding", {})
        except (OSError, ValueError):
            continue
        items.append({"file": str(p), "signature": meta.get("signature"), "kind": meta.get("kind"),
                      "message": meta.get("message"), "reproduced": meta.get("reproduced"),
                      "flaky": bool(meta.get("flaky")), "repro": meta.get("repro")})
    summary = {"split": split, "new_findings": [i for i in items if not i["flaky"]],
               "flaky": [i for i in items if i["flaky"]]}
    atomic_write(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    sarif = {
        "version": "2.1.0",
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "runs": [{
            "tool": {"driver": {"name": "mambafuzz", "rules": [
                {"id": k, "shortDescription": {"text": k.replace("_", " ")}}
                for k in sorted({i["kind"] for i in items if i["kind"]})]}},
            "results": [{
                "ruleId": i["kind"], "level": "warning" if i["flaky"] else "error",
                "message": {"text": f"{i['message']} (replay: {i['repro']})"},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": i["file"]}}}],
                "partialFingerprints": {"signature": i["signature"]},
            } for i in items],
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
    p = argparse.ArgumentParser(prog="python -m fuzz.cli.ci_report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("findings")
    s.add_argument("out")
    s.add_argument("--split", default="fixed")
    s.add_argument("--job", default="pr-fuzz", help="the CI job named in the one-line result (default pr-fuzz)")
    pl = sub.add_parser("plot")
    pl.add_argument("stats", nargs="+")
    pl.add_argument("--out", required=True)
    fn = sub.add_parser("functions")
    fn.add_argument("coverage_json")
    args = p.parse_args(argv)
    if args.cmd == "summarize":
        summary = summarize(Path(args.findings), Path(args.out), args.split)
        print(f"{args.job}: {len(summary['new_findings'])} new finding(s), {len(summary['flaky'])} flaky")
        for i in summary["new_findings"]:
            print(f"  NEW {i['signature']}: {i['repro']}")
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
