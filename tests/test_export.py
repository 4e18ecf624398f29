"""Exported tests stand alone (vLLM APIs only), fail on the installed vLLM and pass with the
finding's candidate fix; the committed ones are what the exporter writes today."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.store import corpus, export

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / "corpus" / "upstream"
CASES = sorted(p for p in UPSTREAM.rglob("*.json") if (p.parent / "fix.py").is_file())  # exports need a fix


def exported(path: Path) -> Path:
    return path.parent / f"test_{path.stem}.py"


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_committed_export_is_current_and_imports_no_mambafuzz(path):
    case = corpus.load_case(path)
    source = export.test_source(case, export._analysis(export.fix_dir(case))[0])
    assert exported(path).read_text() == source, f"re-run: mambafuzz export-test {path} -o {exported(path)}"
    assert "import fuzz" not in source and "from fuzz" not in source


def _pytest(files: list[Path], fix: Path | None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(ROOT),
           "-o", "addopts=", *map(str, files)]
    if fix is not None:
        env["MAMBAFUZZ_PATCHES"] = str(fix)
        cmd[3:3] = ["-p", "fuzz.store.fix_plugin"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_exported_tests_fail_without_and_pass_with_their_fix():
    files = [exported(p) for p in CASES]
    without = _pytest(files, None)
    assert f"{len(files)} failed" in without.stdout, without.stdout[-2000:]
    for d in sorted({p.parent for p in CASES}):
        mine = [exported(p) for p in CASES if p.parent == d]
        with_fix = _pytest(mine, d / "fix.py")
        assert with_fix.returncode == 0 and f"{len(mine)} passed" in with_fix.stdout, with_fix.stdout[-2000:]
