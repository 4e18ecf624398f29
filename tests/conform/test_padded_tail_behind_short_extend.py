"""The V1 conform campaign's one disagreement that no known behaviour explained (2026-12-05):
a padded prompt tail behind a short extend runs Mamba2's prefill path on Model Runner V1
(corpus/untriaged/README.md, "v1_mamba2_padded_remote_tail_behind_short_extend.json"). Its
candidate fix, a reorder that puts the padded tail in the decode region, explains it: the case
agrees on both runners with the fix, and the vLLM-style test beside it, which calls only vLLM's
own InputBatch, reorder and Mamba2 builder, fails on unmodified vLLM 0.32.0 and passes with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mambafuzz.conform.target import first_disagreement, signature
from mambafuzz.model.scenario import from_json
from mambafuzz.sim import patching

ROOT = Path(__file__).resolve().parents[2]
UNTRIAGED = ROOT / "corpus" / "untriaged"
CASE = UNTRIAGED / "v1_mamba2_padded_remote_tail_behind_short_extend.json"
FIX = UNTRIAGED / "candidate_fix_padded_tail_decode_first.py"
TEST = UNTRIAGED / "test_v1_mamba2_padded_tail_behind_short_extend.py"


def test_the_case_disagrees_on_v1_only_and_agrees_with_the_candidate_fix():
    s = from_json(json.loads(CASE.read_text()))
    found = first_disagreement(s, ("v1",))
    assert found is not None and signature(found) == "conform:writes/mamba2@v1"
    assert first_disagreement(s, ("v2",)) is None  # V2 sorts drafted rows first
    with patching.applied(patching.load_patches(str(FIX))):
        assert first_disagreement(s, ("v1", "v2")) is None
    assert first_disagreement(s, ("v1",)) is not None  # the fix is gone again


def _pytest(fix: Path | None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=",
           "-W", "ignore::pytest.PytestUnknownMarkWarning", str(TEST)]
    if fix is not None:
        env["MAMBAFUZZ_PATCHES"] = str(fix)
        cmd[3:3] = ["-p", "mambafuzz.upstream.fix_plugin"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_vllm_style_test_fails_on_vllm_and_passes_with_the_candidate_fix():
    without = _pytest(None)
    assert "1 failed" in without.stdout and "num_decodes=0" in without.stdout, without.stdout[-2000:]
    with_fix = _pytest(FIX)
    assert with_fix.returncode == 0 and "1 passed" in with_fix.stdout, with_fix.stdout[-2000:]
