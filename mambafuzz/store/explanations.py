"""What explains a filed finding, and whether a real engine builds its config: the labels the
campaign console, the PR job's summary.json and its SARIF all print, from one place.

A finding's case file carries them in its `finding` block (mambafuzz.search.triage): the known
fixes that make it replay clean (`attribution.known`), else the untriaged candidate whose fix
does (`attribution.untriaged`), and `engine.real_engine_builds` with the notes of
`engine_realism_notes`. A file written before those labels existed gets the engine label from
its scenario.
"""

from __future__ import annotations

import json
from pathlib import Path

from mambafuzz.model.scenario import engine_realism_notes
from mambafuzz.store.corpus import load_case

NO_EXPLANATION = "no known fix explains it"
SCHEDULER_ONLY = "scheduler-only config"


def explained_by(meta: dict) -> str:
    """The known fixes that explain a finding, else the untriaged candidate whose fix does, else
    NO_EXPLANATION."""
    att = meta.get("attribution") if isinstance(meta.get("attribution"), dict) else {}
    if att.get("known"):
        return ", ".join(att["known"])
    if att.get("untriaged"):
        return str(att["untriaged"])
    return NO_EXPLANATION


def engine_label(meta: dict, path: Path | None = None) -> dict:
    """{"real_engine_builds": bool | None, "notes": [...]} of a finding: from its block, else from
    its case's scenario (None when neither can tell)."""
    engine = meta.get("engine")
    if isinstance(engine, dict) and isinstance(engine.get("real_engine_builds"), bool):
        return {"real_engine_builds": engine["real_engine_builds"], "notes": list(engine.get("notes") or [])}
    if path is not None:
        try:
            notes = engine_realism_notes(load_case(path).scenario.engine)
        except (OSError, ValueError):
            pass
        else:
            return {"real_engine_builds": not notes, "notes": notes}
    return {"real_engine_builds": None, "notes": []}


def tag(label: dict) -> str:
    """A console tag for an engine label: SCHEDULER_ONLY when no real engine builds the config."""
    return f" ({SCHEDULER_ONLY})" if label["real_engine_builds"] is False else ""


def labels(path: Path) -> dict:
    """The labels of the finding filed at `path`: fine_signature, explained_by and engine."""
    try:
        meta = json.loads(path.read_text()).get("finding", {})
    except (OSError, ValueError, AttributeError):
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    return {"file": str(path), "fine_signature": meta.get("fine_signature") or meta.get("signature") or "?",
            "explained_by": explained_by(meta), "engine": engine_label(meta, path)}


def by_explanation(items: list[dict]) -> list[dict]:
    """Findings (dicts with file, fine_signature, explained_by, engine) grouped by what explains
    them, in first-seen order: one entry per explanation with its count, signatures and files.
    Pre-existing findings are many fine signatures of a few known causes; one line each reads."""
    groups: dict[str, dict] = {}
    for item in items:
        g = groups.setdefault(item["explained_by"], {"explained_by": item["explained_by"], "count": 0,
                                                     "signatures": [], "files": [], "scheduler_only": 0})
        g["count"] += 1
        g["signatures"].append(item["fine_signature"])
        g["files"].append(item["file"])
        g["scheduler_only"] += item["engine"]["real_engine_builds"] is False
    return list(groups.values())


def group_line(g: dict) -> str:
    """One console line for a `by_explanation` group."""
    only = (f", {g['scheduler_only']} on a {SCHEDULER_ONLY}" if g["scheduler_only"] else "")
    return (f"{g['count']} x [{g['explained_by']}]{only}: {', '.join(g['signatures'][:3])}"
            + (f" (+{len(g['signatures']) - 3} more)" if len(g["signatures"]) > 3 else ""))
