"""Groups of shared symptoms: findings are grouped (same coarse signature and
minimized mechanism, or one's case replayed under the other's config shows the other), every
member stays on disk, and the CI summary and SARIF show each group once."""

from __future__ import annotations

import dataclasses
import json

from mambafuzz.cli import ci_report
from mambafuzz.search.pr import grouping
from mambafuzz.store.corpus import PRE_EXISTING, atomic_write, case_json
from tests.conftest import first_chunk_scenario


def _file(directory, name, signature, fine, token_seed, **meta):
    scenario = dataclasses.replace(first_chunk_scenario(), token_seed=token_seed)
    path = directory / f"{name}.json"
    atomic_write(path, case_json(scenario, finding={"signature": signature, "fine_signature": fine,
                                                    "kind": signature.split(":")[0], "split": "fixed",
                                                    "message": name, "repro": f"repro {name}", **meta}))
    return path


def _findings(tmp_path):
    """a and b: one mechanism; c: another symptom that a's case reaches under c's config (the fake
    replay says so for token seed 1); d: unrelated."""
    d = tmp_path / "findings"
    paths = [_file(d, "a", "slot_hash:short", "slot_hash:short|mid-block,fresh,chunk-end", 1),
             _file(d, "b", "slot_hash:short", "slot_hash:short|mid-block,fresh,chunk-end", 2),
             _file(d, "c", "stale_read:short", "stale_read:short|decode,fresh,chunk-end", 3),
             _file(d, "d", "stall:liveness", "stall:liveness", 4)]
    _file(d / PRE_EXISTING, "e", "slot_hash:short/chunk-end+ckpt", "slot_hash:short/chunk-end+ckpt|x", 5,
          pre_existing=True, attribution={"known": ["internal_checkpoint_midblock_resume"]})
    return d, paths


def replay(scenario, split):
    return {1: "stale_read:short"}.get(scenario.token_seed)


def test_findings_one_cause_explains_are_one_group_and_each_rule_can_tell(tmp_path):
    d, paths = _findings(tmp_path)
    groups = grouping.group(grouping.members(paths), replay)
    assert [[(m["path"].rsplit("/", 1)[1], m["why"]) for m in g["members"]] for g in groups] == [
        [("a.json", "root"), ("b.json", "mechanism"), ("c.json", "replay")], [("d.json", "root")]]
    assert len(grouping.group(grouping.members(paths))) == 3  # without replays, c stays apart


def test_the_ci_summary_and_sarif_show_each_root_cause_once_and_pre_existing_as_a_note(tmp_path):
    d, paths = _findings(tmp_path)
    grouping.write(d, grouping.group(grouping.members(paths), replay))
    summary = ci_report.summarize(d, tmp_path, "fixed")
    assert len(summary["new_findings"]) == 4 and len(summary["groups"]) == 2
    assert [i["known"] for i in summary["pre_existing"]] == [["internal_checkpoint_midblock_resume"]]
    results = json.loads((tmp_path / "findings.sarif").read_text())["runs"][0]["results"]
    assert [r["level"] for r in results] == ["error", "error", "note"]
    assert len(results[0]["relatedLocations"]) == 2 and "3 findings, one group of shared symptoms" in results[0]["message"]["text"]
    assert all(p.exists() for p in paths)  # every member stays on disk


def test_pre_existing_findings_are_one_line_per_explanation_in_the_summary_and_the_sarif(tmp_path):
    """Three fine signatures of one known cause and one of an untriaged candidate: two groups,
    each one SARIF note whose other findings are its related locations."""
    d, _ = _findings(tmp_path)
    for name, seed in (("f", 6), ("g", 7)):
        _file(d / PRE_EXISTING, name, "slot_hash:short/cow+ckpt", f"slot_hash:short/cow+ckpt|{name}", seed,
              pre_existing=True, attribution={"known": ["internal_checkpoint_midblock_resume"]})
    _file(d / PRE_EXISTING, "h", "stall:step-bound", "stall:step-bound", 8, pre_existing=True,
          attribution={"known": [], "untriaged": "untriaged candidate drop_unadmittable_hit"})
    summary = ci_report.summarize(d, tmp_path, "fixed")
    assert [(g["explained_by"], g["count"]) for g in summary["pre_existing_by_explanation"]] == [
        ("internal_checkpoint_midblock_resume", 3), ("untriaged candidate drop_unadmittable_hit", 1)]
    notes = [r for r in json.loads((tmp_path / "findings.sarif").read_text())["runs"][0]["results"]
             if r["level"] == "note"]
    assert len(notes) == 2 and len(notes[0]["relatedLocations"]) == 2
    assert notes[1]["properties"]["explained_by"] == "untriaged candidate drop_unadmittable_hit"
    assert notes[0]["message"]["text"].endswith("(scheduler-only config)")  # first_chunk_scenario's blocks differ


def _keyed(tmp_path):
    """a and b: one mechanism and one divergence key; c: the same mechanism, another key (another
    bug's change with the same symptom); d: the same mechanism, no key (the base could not run it)."""
    d = tmp_path / "findings"
    paths = [_file(d, n, "slot_hash:short", "slot_hash:short|mid-block,fresh,chunk-end", i) for i, n in enumerate("abcd", 1)]
    keys = dict(zip(paths, ["rows.read_block", "rows.read_block", "rows.num_scheduled_tokens", None]))
    return paths, lambda m: keys[m.path]


def test_with_divergence_keys_findings_join_only_when_their_keys_agree(tmp_path):
    paths, keys = _keyed(tmp_path)
    groups = grouping.group(grouping.members(paths), replay, keys)
    assert [[m["path"].rsplit("/", 1)[1] for m in g["members"]] for g in groups] == [["a.json", "b.json"], ["c.json"], ["d.json"]]
    assert groups[0]["members"][1]["why"] == "mechanism" and groups[0]["members"][1]["divergence"] == "rows.read_block"
    assert len(grouping.group(grouping.members(paths), replay)) == 1  # without a base: the symptom rules join all four


def test_a_finding_linked_to_two_keyed_groups_joins_them_whatever_the_order(tmp_path):
    d = tmp_path / "findings"
    paths = [_file(d, "a", "slot_hash:short", "slot_hash:short|x", 1), _file(d, "b", "stale_read:short", "stale_read:short|y", 2),
             _file(d, "c", "stale_read:short", "stale_read:short|y", 3)]
    same = lambda m: "rows.read_block"  # noqa: E731
    # c links b by mechanism, and a by replay (the fake replay: token seed 1 reaches stale_read:short)
    for order in (paths, paths[::-1]):
        groups = grouping.group(grouping.members(order), replay, same)
        assert len(groups) == 1 and len(groups[0]["members"]) == 3


def test_planted_bugs_with_one_symptom_stay_apart_and_one_bugs_findings_join():
    """Three minimized findings with one coarse and fine signature (bench/RESULTS.md's sets):
    two of manager_skip_one_token_more, one of split_realign_one_block_late. Each is keyed on
    its own bug's vLLM against the unmutated one, as the PR job keys them."""
    from pathlib import Path

    from mambafuzz.search.pr.base_process import observe
    from mambafuzz.search.pr.divergence import key
    from mambafuzz.tools.mutation import planting

    data = Path(__file__).resolve().parents[2] / "data" / "grouping"
    found = grouping.members([data / "skip_a.json", data / "skip_b.json", data / "realign.json"])
    bug = {"skip_a.json": "manager_skip_one_token_more", "skip_b.json": "manager_skip_one_token_more",
           "realign.json": "split_realign_one_block_late"}
    keys = {m.path: key(observe(m.scenario, "fixed", planting.patches(bug[m.path.name])), observe(m.scenario, "fixed"))
            for m in found}
    assert len({(m.signature, m.fine_signature) for m in found}) == 1  # one symptom
    assert [keys[m.path] for m in found] == ["same-outputs", "same-outputs", "rows.num_scheduled_tokens"]
    groups = grouping.group(found, None, lambda m: keys[m.path])
    assert [[m["path"].rsplit("/", 1)[1] for m in g["members"]] for g in groups] == [
        ["skip_a.json", "skip_b.json"], ["realign.json"]]
    assert len(grouping.group(found, None)) == 1  # the symptom rule alone joins the two bugs


def test_the_pr_jobs_two_targets_make_one_summary_that_names_each_findings_target(tmp_path):
    d, paths = _findings(tmp_path)
    grouping.write(d, grouping.group(grouping.members(paths), replay))
    conform = tmp_path / "conform-findings"
    _file(conform, "f", "conform:read/gdn@v2", "conform:read/gdn@v2", 6, origin={"target": "conform"})
    summary = ci_report.summarize([d, conform], tmp_path, "fixed")
    assert summary["new_by_target"] == {"scheduler": 4, "conform": 1} and len(summary["groups"]) == 3
    results = json.loads((tmp_path / "findings.sarif").read_text())["runs"][0]["results"]
    assert [r["properties"]["target"] for r in results] == ["scheduler", "scheduler", "conform", "scheduler"]
    assert results[2]["message"]["text"].startswith("[conform target] ")
