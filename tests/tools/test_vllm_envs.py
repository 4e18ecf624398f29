"""Finding vLLM environments, choosing per-version expectations, and reading the per-version
replays back (no vLLM needed: fake environments and fake processes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mambafuzz.store import corpus, vllm_expectations
from mambafuzz.tools import version_matrix
from mambafuzz.tools.vllm_envs import VllmEnv, discover


def _venv(path: Path) -> Path:
    (path / "bin").mkdir(parents=True)
    py = path / "bin" / "python"
    py.write_text("#!/bin/sh\n")
    py.chmod(0o755)
    return path


def test_discover_finds_checkout_envs_listed_envs_and_dirs_of_envs(tmp_path):
    root = tmp_path / "checkout"
    _venv(root / ".venv-vllm-0.29.0")
    (root / ".vllm-pr" / "vllm").mkdir(parents=True)
    (root / ".vllm-pr" / "vllm" / "__init__.py").write_text("")
    many = tmp_path / "venvs"
    _venv(many / "vllm-0.27.1")
    _venv(many / "vllm-0.28.0")
    (many / "not-an-env").mkdir()
    single = _venv(tmp_path / "elsewhere" / "vllm-0.30.0")
    envs = discover(f"{many}:{single}:{many / 'vllm-0.28.0'}", root=root)
    names = [e.name for e in envs]
    assert names == ["current", "0.29.0", "vllm-pr", "0.27.1", "0.28.0", "0.30.0"]
    pr = envs[2]
    assert pr.python == sys.executable and pr.overlay == str(root / ".vllm-pr")
    assert pr.extra_env == {"VLLM_TARGET_DEVICE": "cpu"}


def test_an_overlay_comes_first_on_the_path_and_the_checkout_second(tmp_path):
    env = VllmEnv("pr", sys.executable, overlay=str(tmp_path)).environ()
    parts = env["PYTHONPATH"].split(":")
    assert parts[0] == str(tmp_path) and Path(parts[1]) == Path(version_matrix.PROJECT_ROOT)


# ---- expected_by_vllm ----------------------------------------------------------------------------

@pytest.mark.parametrize("key, version, hit", [
    ("0.28", "0.28.0", True), ("0.28", "0.28.1+cpu", True), ("0.28.0", "0.28.0rc1", True),
    ("0.28", "0.29.0", False), ("0.28.1", "0.28.0", False), ("0.2", "0.28.0", False), ("0.28", "dev", False),
])
def test_a_version_key_matches_by_release_prefix(key, version, hit):
    assert vllm_expectations.matches(key, version) is hit


def test_overrides_apply_only_on_a_matching_vllm_and_the_longer_key_wins():
    base = {"fixed": "vllm_crash", "prefix": "slot_hash"}
    by = {"0.28.0": {"fixed": "clean"}, "0.28": {"fixed": "stall"}, "0.30": {"prefix": "clean"}}
    assert vllm_expectations.for_installed(base, by, lambda: "0.32.0") == base
    assert vllm_expectations.for_installed(base, by, lambda: "0.28.1") == {"fixed": "stall", "prefix": "slot_hash"}
    assert vllm_expectations.for_installed(base, by, lambda: "0.28.0") == {"fixed": "clean", "prefix": "slot_hash"}


def test_the_loader_applies_the_installed_versions_entry(monkeypatch):
    text = corpus.case_json(_tiny_scenario(), {"fixed": "vllm_crash"})[:-2] + ',\n "expected_by_vllm": {"0.28": {"fixed": "stall"}}}\n'
    monkeypatch.setattr(vllm_expectations, "_installed", lambda: "0.28.0")
    case = corpus.parse_case(text, "case.json")
    assert case.expected == {"fixed": "stall"} and case.extra["expected_by_vllm"] == {"0.28": {"fixed": "stall"}}
    monkeypatch.setattr(vllm_expectations, "_installed", lambda: "0.32.0")
    assert corpus.parse_case(text, "case.json").expected == {"fixed": "vllm_crash"}


def test_the_loader_refuses_a_malformed_entry():
    text = corpus.case_json(_tiny_scenario())[:-2] + ',\n "expected_by_vllm": {"0.28": {"fixed": "broken"}}}\n'
    with pytest.raises(corpus.CaseError, match=r"expected_by_vllm\['0.28'\] must map split names"):
        corpus.parse_case(text, "case.json")


def _tiny_scenario():
    from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario

    return Scenario(engine=EngineConfig(mamba_block_size=64, attn_block_size=16, max_num_batched_tokens=256),
                    requests=[RequestSpec(unique_len=70, max_tokens=2)])


# ---- reading one environment's replay ------------------------------------------------------------

class _FakeEnv(VllmEnv):
    def __init__(self, stdout: str, stderr: str, rc: int):
        super().__init__("fake", sys.executable)
        object.__setattr__(self, "_out", (stdout, stderr, rc))

    def run_cli(self, args, timeout):
        out, err, rc = self._out
        return subprocess.CompletedProcess(args, rc, out, err)


def test_replay_reads_verdicts_and_the_reasons_a_case_cannot_run():
    out = '{"file": "a.json", "verdict": "stall", "expected": "vllm_crash", "findings": [{"signature": "stall:x"}]}\n'
    err = "Triton is installed\nmambafuzz: b.json: cannot run on vLLM 0.28.0: no prefill-checkpoint rule\n"
    cells = version_matrix.replay(_FakeEnv(out, err, 1), ["a.json", "b.json", "c.json"], "fixed")
    assert (cells["a.json"].verdict, cells["a.json"].signature) == ("stall", "stall:x")
    assert cells["b.json"].verdict == "cannot run" and "no prefill-checkpoint rule" in cells["b.json"].reason
    assert cells["c.json"].verdict == "cannot run"  # missing from the output: the last error line says why
    notes: list[str] = []
    assert cells["a.json"].text(notes) == "**stall** (expected vllm_crash)"
    assert cells["b.json"].text(notes) == "cannot run [1]" and len(notes) == 1


def test_a_tool_error_marks_every_case_with_its_one_line():
    err = "mambafuzz: --split prefix cannot run: vLLM 0.29.0 lacks get_mamba_prefill_checkpoint_position\n"
    cells = version_matrix.replay(_FakeEnv("", err, 3), ["a.json"], "prefix")
    assert cells["a.json"].reason.startswith("--split prefix cannot run")


def _one_version(label: str, verdict: dict) -> dict:
    return {"campaign_seconds": 30, "rows": [["corpus/upstream/a.json", "fixed"]],
            "envs": [{"label": label, "version": label, "python": "p", "overlay": None}],
            "cells": {label: {"corpus/upstream/a.json|fixed": verdict}}, "campaigns": {label: "nothing new"}}


def test_jobs_merge_into_one_table_with_one_footnote_per_reason(tmp_path):
    import json

    why = "cannot run on vLLM {v}: no prefill-checkpoint rule"
    files = []
    for v, cell in [("0.28.0", {"verdict": "cannot run", "reason": why.format(v="0.28.0")}),
                    ("0.29.0", {"verdict": "cannot run", "reason": why.format(v="0.29.0")}),
                    ("0.32.0", {"verdict": "slot_hash", "expected": "slot_hash"})]:
        f = tmp_path / f"{v}.json"
        f.write_text(json.dumps(_one_version(v, cell)))
        files.append(f)
    table = version_matrix.render(version_matrix.merge(files))
    assert "| case [split] | 0.28.0 | 0.29.0 | 0.32.0 |" in table
    assert "| upstream/a [fixed] | cannot run [1] | cannot run [1] | slot_hash |" in table
    assert "[1] cannot run on this vLLM: no prefill-checkpoint rule" in table and "[2]" not in table


def test_only_the_current_env_keeps_an_inherited_overlay(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / ".vllm-pr"))
    current = discover("", root=tmp_path)[0]
    assert current.environ()["PYTHONPATH"].split(":")[0] == str(tmp_path / ".vllm-pr")
    other = VllmEnv("0.29.0", "/x/bin/python")
    assert str(tmp_path / ".vllm-pr") not in other.environ()["PYTHONPATH"]
