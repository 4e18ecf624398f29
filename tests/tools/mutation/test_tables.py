"""The mutation run's table (mambafuzz.tools.mutation.tables): a hand classification is reused
only for the source it was made on, and a re-run of survivors supersedes their first rows."""

import json
from pathlib import Path

import pytest

from mambafuzz.tools.mutation import tables

ROOT = Path(__file__).resolve().parents[3]
CLASSES = ROOT / "bench" / "mutation_classes.json"


def test_a_survivor_classified_on_another_source_is_stale():
    """bench/mutation_run.py reuses a hand classification only for the source it was made on."""
    classes = {"mm:X.f:1": {"digest": "abc", "class": "equivalent"}}
    row = {"id": "mm:X.f:1", "status": "survived", "digest": "abc"}
    assert tables.classify(row, classes) == "equivalent"
    assert tables.classify({**row, "digest": "other"}, classes) == "stale"
    assert tables.classify({**row, "id": "mm:X.f:2"}, classes) == "unclassified"
    assert tables.classify({**row, "status": "killed"}, classes) == "killed"
    on_disk = tables.load_classes(CLASSES)
    assert on_disk and all(c["class"] in ("equivalent", "efficiency", "unreachable", "missed") and c["why"]
                           for c in on_disk.values())


def test_a_rerun_of_survivors_supersedes_their_first_rows_in_the_combined_table(tmp_path):
    """--table-from: a mutant's last row counts (a re-run on an unchanging checkout replaces a
    survivor of a run whose checkout changed), other generators' and functions' rows are left out."""
    row = {"generator": "random", "function": "F.f", "max_time": 15}
    first, rerun = tmp_path / "first.jsonl", tmp_path / "rerun.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in [
        {**row, "id": "m:0", "status": "survived"}, {**row, "id": "m:1", "status": "killed"},
        {**row, "id": "m:2", "status": "survived", "generator": "atheris"},
        {**row, "id": "m:3", "status": "survived", "function": "G.g"}]))
    rerun.write_text(json.dumps({**row, "id": "m:0", "status": "killed", "max_time": 10}) + "\n")
    got = tables.last_row_per_mutant([str(first), str(rerun)], "random", {"F.f"})
    assert [(r["id"], r["status"], r["max_time"]) for r in got] == [("m:1", "killed", 15), ("m:0", "killed", 10)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "m:0"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: not a mutation_run row"):
        tables.last_row_per_mutant([str(bad)], "random", {"F.f"})
