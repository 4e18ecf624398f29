"""Engine confirmations recorded in case files (`corpus confirm-engine`, `mambafuzz`/`minimize
--confirm-engine`), with the engine replaced by a fake: what is written where, that writes are
atomic and repeatable, and that bad input is a one-line error.  The real engine path is in
tests/engine_tier/test_engine_tier.py (marked `engine`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from mambafuzz.cli.main import main
from mambafuzz.engine_tier import confirmation
from mambafuzz.model.inputs import decode_json_case
from mambafuzz.store import corpus
from tests.conftest import first_chunk_scenario

ROOT = Path(__file__).resolve().parents[2]
REGRESSION = ROOT / "corpus" / "regressions" / "unaligned_resume_partial_hit.json"
UPSTREAM = ROOT / "corpus" / "upstream" / "internal_checkpoint_midblock_resume" / "internal_checkpoint_poison_read_back.json"


class FakeEngine:
    """Stands in for engine_repro.confirm: a verdict per split, and a record of the calls."""

    def __init__(self, verdicts: dict[str, str] | None = None, fail_on: str | None = None):
        self.verdicts = verdicts or {}
        self.fail_on = fail_on
        self.calls: list[str] = []

    def __call__(self, scenario, split):
        self.calls.append(split)
        if split == self.fail_on:
            raise KeyboardInterrupt
        status = self.verdicts.get(split, "agreed")
        kind = {"diverged": "engine_divergence", "crashed": "engine_crash"}.get(status)
        return {"status": status, "reason": f"fake {status}", "kind": kind, "schedule_match": status != "skipped" or None,
                "schedule_diff": None, "split": split, "adapted": [], "startup_s": 12.3, "replay_s": 4.5}


@pytest.fixture
def fake(monkeypatch):
    engine = FakeEngine()
    monkeypatch.setattr(confirmation, "_default_confirm", engine)
    return engine


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copy(src, dst)
    return dst


def test_finding_gets_one_record_under_its_split(tmp_path, fake, capsys):
    path = _copy(UPSTREAM, tmp_path)
    before = json.loads(path.read_text())
    before["finding"].pop(corpus.ENGINE_CONFIRMATION, None)  # corpus/ carries one already: it is replaced
    fake.verdicts = {"fixed": "diverged"}
    assert main(["corpus", "confirm-engine", str(path)]) == 1  # a divergence is a finding
    after = json.loads(path.read_text())
    rec = after["finding"].pop(corpus.ENGINE_CONFIRMATION)
    assert after == before  # nothing else changed
    assert fake.calls == ["fixed"]
    assert rec["status"] == "diverged" and rec["kind"] == "engine_divergence" and rec["split"] == "fixed"
    assert rec["vllm"].startswith("vllm") and "startup_s" not in rec and "replay_s" not in rec
    assert rec["harness"][0] == "slot_hash"  # the oracle's prediction, to read the engine's status against
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"{path} [split fixed] engine: DIVERGED engine_divergence: fake diverged; schedule matches the "
                      f"harness; harness: {', '.join(rec['harness'])}")


def test_regression_gets_a_table_keyed_by_its_expected_splits(tmp_path, fake):
    path = _copy(REGRESSION, tmp_path)
    fake.verdicts = {"fixed": "agreed", "prefix": "skipped", "realign": "diverged"}
    assert main(["corpus", "confirm-engine", str(tmp_path)]) == 1
    raw = json.loads(path.read_text())
    table = raw[corpus.ENGINE_CONFIRMATION]
    assert list(table) == ["fixed", "prefix", "realign"] == fake.calls
    assert {k: v["status"] for k, v in table.items()} == fake.verdicts
    assert table["fixed"]["harness"] == [] and table["realign"]["harness"][0] == "slot_hash"
    case = corpus.load_case(path)  # the loader keeps the field and the scenario validates
    assert case.extra[corpus.ENGINE_CONFIRMATION] == table
    assert case.scenario == corpus.load_case(REGRESSION).scenario and case.expected == raw["expected"]
    assert decode_json_case(path.read_bytes()) == case.scenario  # the fuzz targets' decoder too
    assert main(["repro", str(path), "--split", "realign"]) == 1  # the expected table still drives repro

    fake.calls.clear()  # --split refreshes one entry and keeps the others
    fake.verdicts = {"fixed": "crashed"}
    assert main(["corpus", "confirm-engine", "--split", "fixed", str(path)]) == 1
    table = json.loads(path.read_text())[corpus.ENGINE_CONFIRMATION]
    assert fake.calls == ["fixed"] and table["fixed"]["status"] == "crashed" and table["realign"]["status"] == "diverged"


def test_rerun_rewrites_identical_bytes(tmp_path, fake):
    path = _copy(REGRESSION, tmp_path)
    assert main(["corpus", "confirm-engine", str(path)]) == 0
    first = path.read_bytes()
    assert main(["corpus", "confirm-engine", str(path)]) == 0
    assert path.read_bytes() == first


def test_interrupt_leaves_the_file_as_it_was_and_no_temporaries(tmp_path, monkeypatch, capsys):
    path = _copy(REGRESSION, tmp_path)
    before = path.read_bytes()
    monkeypatch.setattr(confirmation, "_default_confirm", FakeEngine(fail_on="realign"))
    assert main(["corpus", "confirm-engine", str(path)]) == 130  # fixed and prefix done, realign interrupted
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [path.name]
    assert f"mambafuzz corpus confirm-engine {path}" in capsys.readouterr().err


def test_a_failed_write_leaves_the_file_whole(tmp_path, fake, monkeypatch):
    path = _copy(UPSTREAM, tmp_path)
    before = path.read_bytes()

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(corpus.os, "replace", no_rename)
    assert main(["corpus", "confirm-engine", str(path)]) == 2
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == [path.name]


def test_a_file_edited_meanwhile_is_not_overwritten(tmp_path, monkeypatch, capsys):
    path = _copy(REGRESSION, tmp_path)
    edited = first_chunk_scenario().dumps()

    def edit_then_agree(scenario, split):
        path.write_text(edited)
        return FakeEngine()(scenario, split)

    monkeypatch.setattr(confirmation, "_default_confirm", edit_then_agree)
    assert main(["corpus", "confirm-engine", "--split", "fixed", str(path)]) == 2
    assert path.read_text() == edited
    assert "scenario changed while it was being confirmed" in capsys.readouterr().err


def test_bad_input_is_one_line_exit_2(tmp_path, fake, capsys):
    good = _copy(UPSTREAM, tmp_path)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert main(["corpus", "confirm-engine", str(tmp_path)]) == 2  # the good file is still confirmed
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mambafuzz: {broken}: not valid JSON")
    assert "engine_confirmation" in json.loads(good.read_text())["finding"]
    assert broken.read_text() == "{not json"
    for argv, msg in ((["corpus", "confirm-engine", str(tmp_path / "missing")], "missing: no such file or directory"),
                      (["corpus", "confirm-engine", "--split", "nope", str(good)], "unknown split 'nope'"),
                      (["corpus", "confirm-engine", str(tmp_path / "empty")], "no .json case files")):
        (tmp_path / "empty").mkdir(exist_ok=True)
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1 and "Traceback" not in err
    wrong = tmp_path / "wrong_field.json"
    raw = json.loads(good.read_text())
    raw[corpus.ENGINE_CONFIRMATION] = ["agreed"]
    wrong.write_text(json.dumps(raw))
    with pytest.raises(corpus.CaseError, match="engine_confirmation must map split names"):
        corpus.load_case(wrong)


def test_record_rejects_an_unknown_status():
    with pytest.raises(ValueError, match="not one of"):
        confirmation.record({"status": "maybe", "split": "fixed"})


def test_minimize_confirm_engine_records_on_the_minimized_file(tmp_path, fake, capsys):
    path = tmp_path / "big.json"
    raw = json.loads(first_chunk_scenario().dumps())
    raw["finding"] = {"signature": "old", "engine_confirmation": {"status": "agreed", "split": "prefix"}}
    path.write_text(json.dumps(raw))
    fake.verdicts = {"prefix": "skipped"}
    assert main(["minimize", str(path), "--split", "prefix", "--budget", "3", "--confirm-engine"]) == 1
    small = json.loads((tmp_path / "big.min.json").read_text())
    rec = small["finding"][corpus.ENGINE_CONFIRMATION]
    assert fake.calls == ["prefix"] and rec["status"] == "skipped" and rec["split"] == "prefix"
    assert "[split prefix] engine: SKIPPED: fake skipped" in capsys.readouterr().out
    from mambafuzz.checks.pipeline import evaluate  # the message describes the minimized scenario, not the input

    minimized = corpus.load_case(tmp_path / "big.min.json").scenario
    assert small["finding"]["message"] == evaluate(minimized, "prefix", efficiency=False).verdict.primary.message
    fake.calls.clear()  # without the flag: no confirmation, and the input's stale one is not copied
    assert main(["minimize", str(path), "--split", "prefix", "--budget", "3", "-o", str(tmp_path / "b.json")]) == 1
    assert fake.calls == [] and corpus.ENGINE_CONFIRMATION not in json.loads((tmp_path / "b.json").read_text())["finding"]


def _fake_campaign(monkeypatch, tmp_path, interrupted: bool):
    """run_campaign replaced by one that files a finding and a flaky one, as the workers do."""
    from mambafuzz.search import supervisor

    findings = tmp_path / "findings"
    files = []
    for name, flaky in (("prefix-slot_hash.json", False), ("flaky-prefix-stall.json", True)):
        raw = json.loads(first_chunk_scenario().dumps())
        raw["finding"] = {"signature": name, "kind": "slot_hash", "split": "prefix", "flaky": flaky,
                          "reproduced": "3/3"}
        files.append(findings / name)
        corpus.atomic_write(files[-1], json.dumps(raw, indent=1) + "\n")

    def run_campaign(cfg):
        return supervisor.CampaignResult(sorted(files), 10, 1.0, None, None, interrupted, [1], 0.5, [])

    monkeypatch.setattr(supervisor, "run_campaign", run_campaign)
    return files


def test_fuzz_confirm_engine_confirms_each_minimized_finding_in_the_parent(tmp_path, fake, monkeypatch, capsys):
    real, flaky = _fake_campaign(monkeypatch, tmp_path, interrupted=False)
    fake.verdicts = {"prefix": "diverged"}
    argv = ["fuzz", "--split", "prefix", "--generator", "random", "--max-time", "1", "--findings",
            str(tmp_path / "findings"), "--corpus", str(tmp_path / "corpus"), "--confirm-engine"]
    assert main(argv) == 1
    assert fake.calls == ["prefix"]  # the flaky one is not minimized: not confirmed
    assert json.loads(real.read_text())["finding"][corpus.ENGINE_CONFIRMATION]["status"] == "diverged"
    assert corpus.ENGINE_CONFIRMATION not in json.loads(flaky.read_text())["finding"]
    assert f"{real} [split prefix] engine: DIVERGED" in capsys.readouterr().out
    fake.calls.clear()
    assert main(argv[:-1]) == 1 and fake.calls == []  # no flag, no engine


def test_fuzz_confirm_engine_after_ctrl_c_only_says_how(tmp_path, fake, monkeypatch, capsys):
    real, _ = _fake_campaign(monkeypatch, tmp_path, interrupted=True)
    before = real.read_bytes()
    assert main(["fuzz", "--split", "prefix", "--generator", "random", "--max-time", "1", "--findings",
                 str(tmp_path / "findings"), "--corpus", str(tmp_path / "corpus"), "--confirm-engine"]) == 1
    assert fake.calls == [] and real.read_bytes() == before
    assert f"later: mambafuzz corpus confirm-engine {real}" in capsys.readouterr().out


# ---- the real engine (pytest -m engine) ------------------------------------------------------

def _cpu_partial_hit():
    """CPU-runnable (block 256 for attention and mamba, unit 16, no spec decode, dense
    retention): r0 (401 tokens) publishes a partial-tail state@400; r1 and r2 (700 tokens,
    same 400-token prefix) are admitted with that unaligned 400-token hit, so their first chunk
    starts mid-block, the case the pre-fix realign gate mishandles with MTP."""
    from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario

    return Scenario(
        engine=EngineConfig(mamba_block_size=256, attn_block_size=256, prefix_match_unit=16, max_num_batched_tokens=2048,
                            prefix_cache_retention_interval=None),
        prefixes=[400],
        requests=[RequestSpec(prefix_ids=[0], unique_len=1, max_tokens=4),
                  RequestSpec(arrival_step=4, prefix_ids=[0], unique_len=300, max_tokens=4),
                  RequestSpec(arrival_step=10, prefix_ids=[0], unique_len=300, max_tokens=4)])


@pytest.mark.engine
def test_cpu_partial_hit_is_clean_under_the_prefix_gates_in_the_harness_and_on_the_engine(tmp_path, capsys):
    """Without spec decode the pre-fix gates equal the fix: the last cacheable boundary is
    (num_tokens - 1) // block * block, so a block boundary past it is at or past the prompt's
    end and no chunk can cross it early.  The harness says clean, and the real engine agrees."""
    from mambafuzz.engine_tier import engines
    from mambafuzz.sim.engine import harness, splits

    s = _cpu_partial_hit()
    assert engines.unsupported(s) is None
    trace = harness.run(s, splits.resolve("realign"), "realign")
    resumed = [c for st in trace.steps for c in st.chunks if c.resumed_from_hit]
    assert [(c.request_id, c.start) for c in resumed] == [("r1", 400), ("r2", 400)]  # mid-block starts
    path = tmp_path / "cpu_partial_hit.json"
    path.write_text(corpus.case_json(s, {"fixed": "clean", "prefix": "clean", "realign": "clean"}))
    for split in ("fixed", "prefix", "realign"):
        assert main(["repro", str(path), "--split", split]) == 0
    assert main(["corpus", "confirm-engine", str(path)]) == 0
    table = json.loads(path.read_text())[corpus.ENGINE_CONFIRMATION]
    for split in ("fixed", "prefix", "realign"):
        assert table[split]["status"] == "agreed" and table[split]["schedule_match"] is True, table[split]


@pytest.mark.engine
def test_a_poisoning_split_is_confirmed_as_a_real_divergence(tmp_path, capsys):
    """The oracle's poisoned entry (naive split, no spec decode) is a wrong answer on the real
    model: recorded per split for a case without a finding block, and in the finding block."""
    from tests.engine_tier.test_engine_tier import POISON

    naive = "tests.engine_tier.test_engine_tier:naive_split"
    regression = tmp_path / "poison.json"
    regression.write_text(corpus.case_json(POISON, {"fixed": "clean", naive: "slot_hash"}))
    assert main(["repro", str(regression), "--split", naive]) == 1
    assert main(["corpus", "confirm-engine", str(regression)]) == 1
    table = json.loads(regression.read_text())[corpus.ENGINE_CONFIRMATION]
    assert table["fixed"]["status"] == "agreed" and table["fixed"]["schedule_match"] is True
    bad = table[naive]
    assert bad["status"] == "diverged" and bad["kind"] == "engine_divergence" and bad["schedule_match"] is True
    assert bad["reason"].startswith("r1: token 0")  # the request that restored the poisoned state
    assert bad["harness"] == ["slot_hash", "resume_state", "output_divergence"] and table["fixed"]["harness"] == []

    finding = tmp_path / "finding.json"
    finding.write_text(corpus.case_json(POISON, finding={"signature": "slot_hash:short/chunk-end", "split": naive}))
    assert main(["corpus", "confirm-engine", str(finding)]) == 1
    rec = json.loads(finding.read_text())["finding"][corpus.ENGINE_CONFIRMATION]
    assert {k: rec[k] for k in ("status", "split", "schedule_match")} == {"status": "diverged", "split": naive,
                                                                        "schedule_match": True}
    assert f"{finding} [split {naive}] engine: DIVERGED engine_divergence: r1: token 0" in capsys.readouterr().out


@pytest.mark.engine
def test_minimized_slot_hash_without_a_reader_agrees_and_says_so(tmp_path, capsys, monkeypatch):
    """`minimize` keeps the signature (a poisoned entry is published), not a request that
    reads it back; on the engine nothing can then differ.  The record shows both sides: the
    engine agreed, and the harness predicted slot_hash only (no resume_state/output_divergence)."""
    from tests.engine_tier.test_engine_tier import POISON

    naive = "tests.engine_tier.test_engine_tier:naive_split"
    path = tmp_path / "poison.json"
    path.write_text(POISON.dumps())
    assert main(["minimize", str(path), "--split", naive, "--budget", "20", "--confirm-engine"]) == 1
    small = json.loads((tmp_path / "poison.min.json").read_text())
    rec = small["finding"][corpus.ENGINE_CONFIRMATION]
    assert len(small["requests"]) == 1  # the reader r1 was minimized away
    assert rec["status"] == "agreed" and rec["harness"] == ["slot_hash"] and rec["schedule_match"] is True
