"""The atheris target run with no supervisor, as ClusterFuzzLite runs its PyInstaller bundle
(.clusterfuzzlite/build.sh): only a crash is reported there, so a new finding must raise, and a
known bug (the corpus the bundle ships) must not."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from mambafuzz.search import target_runtime
from mambafuzz.search.worker_protocol import CONFIG_ENV, WorkerConfig
from mambafuzz.store import corpus
from tests.conftest import first_chunk_scenario

ROOT = Path(__file__).resolve().parents[2]


def test_a_new_finding_raises_once_filed_when_crash_on_new(tmp_path):
    rt = target_runtime.Runtime(WorkerConfig(split="prefix", findings=str(tmp_path), minimize_budget=0.0,
                                             crash_on_new=True))
    with pytest.raises(target_runtime.NewFinding, match=r"^slot_hash:.*reproduced 3/3.*--split prefix"):
        rt.run_scenario(first_chunk_scenario(), {"input": "test"})
    assert [f.violation.kind for f in rt.triage.filed] == ["slot_hash"] and rt.triage.filed[0].path.exists()


def test_without_crash_on_new_a_finding_is_filed_and_the_worker_goes_on(tmp_path):
    rt = target_runtime.Runtime(WorkerConfig(split="prefix", findings=str(tmp_path), minimize_budget=0.0))
    assert rt.run_scenario(first_chunk_scenario(), {"input": "test"}) is True


def test_a_known_upstream_bug_does_not_raise_in_the_standalone_configuration(tmp_path, monkeypatch):
    """Unmodified vLLM shows the upstream findings; a bundle that crashed on them would fail every run."""
    monkeypatch.chdir(tmp_path)
    config = WorkerConfig.standalone(ROOT)
    rt = target_runtime.Runtime(config)
    case = corpus.load_case(next((ROOT / "corpus/upstream/internal_checkpoint_midblock_resume").glob("*.json"))).scenario
    assert rt.judge.verdict(case) is not None  # a violation on this vLLM...
    assert rt.run_scenario(case, {"input": "test"}) is False  # ...attributed to its known bug: no raise
    assert rt.triage.filed == []


def test_a_bundled_target_without_a_worker_config_runs_standalone(monkeypatch, tmp_path):
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert WorkerConfig.from_environment() == WorkerConfig()  # a bare script run: the defaults
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)  # what PyInstaller's bootloader sets
    config = WorkerConfig.from_environment()
    assert config == WorkerConfig.standalone(tmp_path)
    assert config.crash_on_new and config.generator == "atheris" and config.minimize_budget == 0
    config_file = tmp_path / "w.json"
    WorkerConfig(split="prefix").write(config_file)
    monkeypatch.setenv(CONFIG_ENV, str(config_file))  # a supervisor's file still wins
    assert WorkerConfig.from_environment() == WorkerConfig(split="prefix")


def test_the_bundle_ships_the_known_bug_directories_the_standalone_configuration_reads():
    build = (ROOT / ".clusterfuzzlite" / "build.sh").read_text()
    shipped = set(re.findall(r"--add-data\s+(\S+):(\S+)", build))
    for d in WorkerConfig.standalone(ROOT).known_dirs:
        rel = Path(d).relative_to(ROOT).as_posix()
        assert (rel, rel) in shipped, f"build.sh does not bundle {rel}"
        assert any(Path(d).rglob("*.json")), d
