"""`ci/matrix [VERSIONS...]`: every corpus/regressions and corpus/upstream case, under each
split its `expected` names, replayed on every vLLM environment (mambafuzz/tools/vllm_envs.py), plus a
short random campaign on each. Writes the case x version table to reports/matrix.md (and the
raw cells to reports/matrix.json). Each environment runs `mambafuzz repro --json` in its own
interpreter, so each uses its own scheduler, manager and config classes."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from mambafuzz.store.corpus import iter_cases, split_key
from mambafuzz.tools.vllm_envs import PROJECT_ROOT, VllmEnv, discover

CASE_DIRS = ("corpus/regressions", "corpus/upstream")
REPLAY_TIMEOUT = 1800.0


@dataclass
class Cell:
    verdict: str  # a violation kind, "clean", or "cannot run"
    reason: str = ""  # why it cannot run
    expected: str | None = None  # what the case expects on this vLLM (after expected_by_vllm)
    signature: str | None = None  # the first finding's signature

    def text(self, notes: list[str]) -> str:
        if self.verdict == "cannot run":
            if self.reason not in notes:
                notes.append(self.reason)
            return f"cannot run [{notes.index(self.reason) + 1}]"
        if self.expected is not None and self.expected != self.verdict:
            return f"**{self.verdict}** (expected {self.expected})"
        return self.verdict


def _rows(root: Path) -> list[tuple[str, str]]:
    """(case path relative to the checkout, split) for every split a case expects a verdict under."""
    rows = []
    for case in iter_cases([root / d for d in CASE_DIRS], warn=lambda msg: None):
        rel = str(case.path.relative_to(root))
        for split in sorted(case.expected or {"fixed": "clean"}, key=lambda s: (s != "fixed", s)):
            rows.append((rel, split))
    return rows


def _stderr_reasons(stderr: str) -> dict[str, str]:
    out = {}
    for line in stderr.splitlines():
        m = re.match(r"mambafuzz: (\S+?\.json): (.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def replay(env: VllmEnv, files: list[str], split: str, timeout: float = REPLAY_TIMEOUT) -> dict[str, Cell]:
    try:
        split_name, runner = split_key(split)  # an expected-table key: split, or split@runner
        proc = env.run_cli(["repro", "--json", "--split", split_name, *(["--runner", runner] if runner else []),
                            *files], timeout)
    except subprocess.TimeoutExpired:
        return {f: Cell("cannot run", f"repro over {timeout:.0f}s") for f in files}
    cells: dict[str, Cell] = {}
    for line in proc.stdout.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "file" in obj:
            first = (obj.get("findings") or [{}])[0].get("signature")
            cells[obj["file"]] = Cell(obj["verdict"], expected=obj.get("expected"), signature=first)
    for f, reason in _stderr_reasons(proc.stderr).items():
        cells.setdefault(f, Cell("cannot run", reason))
    tail = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.startswith("mambafuzz: ")), "")
    for f in files:
        cells.setdefault(f, Cell("cannot run", tail.removeprefix("mambafuzz: ") or f"repro exited {proc.returncode}"))
    return cells


def campaign(env: VllmEnv, seconds: float, out: Path) -> str:
    """A short random-generator campaign on `--split fixed`; what it filed, as one cell."""
    out.mkdir(parents=True, exist_ok=True)
    args = ["fuzz", "--generator", "random", "--max-time", str(seconds), "--split", "fixed", "--quiet",
            "--corpus", str(out / "corpus"), "--findings", str(out / "findings")]
    try:
        proc = env.run_cli(args, seconds * 4 + 600)
    except subprocess.TimeoutExpired:
        return "cannot run: campaign did not stop"
    found = re.findall(r"^(?:FOUND|FLAKY) (\S+)", proc.stdout, re.M)
    execs = re.search(r"^summary: (\d+) executions", proc.stdout, re.M)
    if proc.returncode not in (0, 1):
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return f"cannot run: {tail.removeprefix('mambafuzz: ')}"
    ran = f"{execs.group(1)} execs" if execs else "? execs"
    return f"{ran}: " + (", ".join(f"`{s}`" for s in found) if found else "nothing new")


def version_of(env: VllmEnv) -> str:
    try:
        proc = env.run_cli(["--version"], 300)
    except subprocess.TimeoutExpired:
        return "?"
    m = re.search(r"vLLM (\S+) at (\S+)", proc.stdout)
    return m.group(1) if m else "?"


def _generic(reason: str) -> str:
    """A reason without the version and path in it, so one footnote serves every version."""
    return re.sub(r"vLLM \d[\w.+-]*", "this vLLM", re.sub(r"vLLM \S+ at \S+", "this vLLM", reason)).strip()


def render(data: dict) -> str:
    """The markdown table of a matrix.json (one run, or several merged)."""
    notes: list[str] = []
    envs = data["envs"]
    head = ["case [split]"] + [e["label"] if e["label"] == e["version"] else f"{e['label']} ({e['version']})"
                               for e in envs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for path, split in data["rows"]:
        row = [f"{Path(path).parent.name}/{Path(path).stem} [{split}]"]
        for e in envs:
            raw = data["cells"][e["label"]].get(f"{path}|{split}")
            if raw is None:
                row.append("not run")
                continue
            cell = Cell(**raw)
            cell.reason = _generic(cell.reason)
            row.append(cell.text(notes))
        lines.append("| " + " | ".join(row) + " |")
    lines.append("| " + " | ".join([f"random campaign, {data['campaign_seconds']:g} s, fixed"] + [
        data["campaigns"].get(e["label"], "not run") for e in envs]) + " |")
    lines.append("")
    lines.extend(f"[{i}] {n}  " for i, n in enumerate(notes, 1))
    return "\n".join(lines) + "\n"


def merge(files: list[Path]) -> dict:
    """Several matrix.json files (e.g. one per CI job, one version each) as one."""
    out: dict = {"campaign_seconds": 0, "rows": [], "envs": [], "cells": {}, "campaigns": {}}
    for f in files:
        data = json.loads(f.read_text())
        out["campaign_seconds"] = max(out["campaign_seconds"], data["campaign_seconds"])
        out["rows"] += [r for r in data["rows"] if r not in out["rows"]]
        for e in data["envs"]:
            if e["label"] not in out["cells"]:
                out["envs"].append(e)
                out["cells"][e["label"]] = data["cells"][e["label"]]
                if e["label"] in data["campaigns"]:
                    out["campaigns"][e["label"]] = data["campaigns"][e["label"]]
    return out


def run_matrix(envs: list[VllmEnv], campaign_seconds: float, out: Path, wanted: list[str]) -> dict:
    rows = _rows(PROJECT_ROOT)
    by_split: dict[str, list[str]] = {}
    for path, split in rows:
        by_split.setdefault(split, []).append(path)
    data: dict = {"campaign_seconds": campaign_seconds, "rows": [list(r) for r in rows], "envs": [], "cells": {},
                  "campaigns": {}}
    for env in envs:
        version = version_of(env)
        label = version if env.name == "current" else env.name
        if wanted and not any(label.startswith(w) for w in wanted):
            continue
        data["envs"].append({"label": label, "version": version, "python": env.python, "overlay": env.overlay})
        print(f"matrix: {label} (vLLM {version}, {env.python}{', overlay ' + env.overlay if env.overlay else ''})",
              file=sys.stderr, flush=True)
        cells = data["cells"][label] = {}
        for split, files in by_split.items():
            for f, cell in replay(env, files, split).items():
                cells[f"{f}|{split}"] = asdict(cell)
        if campaign_seconds > 0:
            data["campaigns"][label] = campaign(env, campaign_seconds, out / "matrix" / label)
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ci/matrix", description=__doc__)
    p.add_argument("versions", nargs="*", metavar="VERSION",
                   help="environment labels to include (prefix match: 0.29 takes 0.29.0); default all")
    p.add_argument("--campaign-seconds", type=float, default=30.0, metavar="SECONDS",
                   help="length of the random campaign on each version (0: none; default 30)")
    p.add_argument("--out", default="reports", metavar="DIR", help="where matrix.md and matrix.json go")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="render these matrix.json files as one table instead")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.merge:
        data = merge([Path(f) for f in args.merge])
    else:
        data = run_matrix(discover(), args.campaign_seconds, out, args.versions)
    table = render(data)
    out.mkdir(parents=True, exist_ok=True)
    (out / "matrix.md").write_text(table)
    (out / "matrix.json").write_text(json.dumps(data, indent=1) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
