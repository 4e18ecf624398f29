"""The CI gate fails, naming the case, when a regression case's expectation is wrong."""

import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_regress_fails_and_names_an_injected_wrong_expectation(tmp_path):
    regs = tmp_path / "regressions"
    regs.mkdir()
    src = ROOT / "corpus" / "regressions" / "first_chunk_fragmented.json"
    shutil.copy(src, regs / "first_chunk_fragmented.json")
    wrong = json.loads(src.read_text())
    wrong["expected"] = {"prefix": "clean"}  # the prefix split really poisons this case
    (regs / "injected_wrong.json").write_text(json.dumps(wrong))
    env = dict(os.environ, MAMBAFUZZ_REGRESSIONS=str(regs))
    proc = subprocess.run(["bash", "ci/regress", "600"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "injected_wrong[prefix]" in out and "expected clean, got slot_hash" in out
    assert "first_chunk_fragmented[prefix] FAILED" not in out
    assert (ROOT / "reports" / "regress.xml").exists()
