"""What explains a finding and whether a real engine builds its config, one place for the
console, summary.json and the SARIF (mambafuzz.store.explanations)."""

from __future__ import annotations

import dataclasses

from mambafuzz.store import explanations
from mambafuzz.store.corpus import atomic_write, case_json
from tests.conftest import first_chunk_scenario


def test_known_fixes_come_before_an_untriaged_candidate_and_none_is_said_plainly():
    assert explanations.explained_by({"attribution": {"known": ["a", "b"], "untriaged": "untriaged candidate c"}}) == "a, b"
    assert explanations.explained_by({"attribution": {"known": [], "untriaged": "untriaged candidate c"}}) == \
        "untriaged candidate c"
    assert explanations.explained_by({}) == explanations.NO_EXPLANATION


def test_the_engine_label_comes_from_the_block_or_else_from_the_case(tmp_path):
    real = first_chunk_scenario()  # attention block finer than the mamba block: scheduler-only
    tied = dataclasses.replace(real, engine=dataclasses.replace(real.engine, attn_block_size=real.engine.mamba_block_size))
    old, ok = tmp_path / "old.json", tmp_path / "ok.json"
    atomic_write(old, case_json(real, finding={"signature": "stall:step-bound"}))
    atomic_write(ok, case_json(tied, finding={"signature": "stall:step-bound"}))
    assert explanations.labels(old)["engine"]["real_engine_builds"] is False
    assert explanations.labels(ok)["engine"] == {"real_engine_builds": True, "notes": []}
    assert explanations.engine_label({"engine": {"real_engine_builds": True, "notes": []}}, old)["real_engine_builds"]
    assert explanations.tag(explanations.labels(old)["engine"]) == " (scheduler-only config)"


def test_findings_group_by_explanation_with_counts():
    def item(sig, why, builds=True):
        return {"file": f"{sig}.json", "fine_signature": sig, "explained_by": why,
                "engine": {"real_engine_builds": builds, "notes": []}}

    groups = explanations.by_explanation([item("s1", "k"), item("s2", explanations.NO_EXPLANATION),
                                          item("s3", "k", builds=False), item("s4", "k")])
    assert [(g["explained_by"], g["count"], g["signatures"]) for g in groups] == [
        ("k", 3, ["s1", "s3", "s4"]), (explanations.NO_EXPLANATION, 1, ["s2"])]
    assert explanations.group_line(groups[0]) == "3 x [k], 1 on a scheduler-only config: s1, s3, s4"
