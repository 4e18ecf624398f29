"""StepRecord's shared empty lists: a step's unused list fields are one unchangeable NO_ITEMS."""

import copy

import pytest

from mambafuzz.sim.trace import NO_ITEMS, StepRecord

LIST_FIELDS = ("arrivals", "aborts", "admissions", "chunks", "writes", "cache", "preempted", "finished", "recv_done")


def test_an_empty_step_prints_and_compares_as_a_record_of_empty_lists():
    """The trace digest hashes repr(record): a field left NO_ITEMS must read exactly as `[]` did."""
    rec = StepRecord(3)
    assert repr(rec) == "StepRecord(step=3, " + ", ".join(f"{name}=[]" for name in LIST_FIELDS) + ")"
    assert rec == StepRecord(3, **{name: [] for name in LIST_FIELDS})
    assert copy.deepcopy(rec) == rec


def test_add_gives_the_field_a_list_of_its_own_and_leaves_other_records_empty():
    first, second = StepRecord(0), StepRecord(1)
    first.add("arrivals", "r0")
    first.add("arrivals", "r1")
    assert first.arrivals == ["r0", "r1"] and first.arrivals is not NO_ITEMS
    assert second.arrivals == [] and second.arrivals is NO_ITEMS
    assert StepRecord(2).arrivals == []


@pytest.mark.parametrize("change", [lambda items: items.append("r0"), lambda items: items.extend(["r0"]),
                                    lambda items: items.insert(0, "r0"), lambda items: items.__iadd__(["r0"])])
def test_a_writer_that_appends_to_a_shared_field_fails_instead_of_filling_every_record(change):
    rec = StepRecord(0)
    with pytest.raises(TypeError, match="NO_ITEMS"):
        change(rec.finished)
    assert StepRecord(1).finished == [] and len(NO_ITEMS) == 0


def test_a_record_built_with_only_its_step_is_a_record_of_empty_lists():
    """The harness builds its per-step record as `object.__new__(StepRecord)` plus `step`: every list
    field must then read, print, compare, copy and fill exactly as the constructor's record."""
    import pickle

    rec = object.__new__(StepRecord)
    rec.step = 3
    assert repr(rec) == repr(StepRecord(3)) and rec == StepRecord(3)
    assert all(getattr(rec, name) is NO_ITEMS for name in LIST_FIELDS)
    assert copy.deepcopy(rec) == rec and pickle.loads(pickle.dumps(rec)) == rec
    rec.add("cache", "entry")
    rec.chunks = ["chunk"]
    assert rec == StepRecord(3, cache=["entry"], chunks=["chunk"]) and len(NO_ITEMS) == 0
    with pytest.raises(TypeError, match="NO_ITEMS"):
        rec.writes.append("write")
