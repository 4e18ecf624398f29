"""The resource kinds export as standalone vLLM tests (mambafuzz export-test): a `pool_accounting`
case asserts the pool's counts after every step, a `capacity` case that a request alone holds no
more than vLLM's start-up reserve and is never preempted. Each exported test passes on unmodified
vLLM and fails with the planted bug of its kind only (mambafuzz.tools.mutation.planted `resource_*`), so
it tests the rule, not the case."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mambafuzz.store import corpus
from mambafuzz.store.corpus import case_json
from mambafuzz.upstream import export

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checks"))
from test_resources import scenario  # noqa: E402  the resource tests' inputs

ROOT = Path(__file__).resolve().parents[2]
# signature -> (the case's engine and request, the planted bug it must catch, a line of its message)
CASES = {
    "pool_accounting:free-count": (({"max_num_batched_tokens": 64}, {"unique_len": 90, "max_tokens": 3}),
                                   "resource_free_count_inflated", "usable blocks have no reference"),
    "capacity:held-over-reserve/mamba": (({"max_num_batched_tokens": 32}, {"unique_len": 200, "max_tokens": 4}),
                                         "resource_state_freed_late", "where vLLM's start-up check reserved"),
}


def _run(test: Path, planted: str | None, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=",
           "-W", "ignore::pytest.PytestUnknownMarkWarning", str(test)]
    if planted is not None:
        fix = tmp_path / f"planted_{planted}.py"
        fix.write_text(f"from mambafuzz.tools.mutation import planting\n\nPATCHES = planting.patches({planted!r})\n")
        env["MAMBAFUZZ_PATCHES"] = str(fix)
        cmd[3:3] = ["-p", "mambafuzz.upstream.fix_plugin"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("signature", sorted(CASES))
def test_a_resource_finding_exports_a_test_that_fails_with_its_bug_only(signature, tmp_path):
    (engine, request), planted, message = CASES[signature]
    s = scenario({"mamba_block_size": 32, "attn_block_size": 32, **engine}, [request])
    path = tmp_path / "case.json"
    path.write_text(case_json(s, finding={"signature": signature}, note="a planted bug's case"))
    source = export.test_source(corpus.load_case(path))
    assert "import mambafuzz" not in source
    test = tmp_path / "test_case.py"
    test.write_text(source)
    clean = _run(test, None, tmp_path)
    assert clean.returncode == 0 and "1 passed" in clean.stdout, clean.stdout[-2000:]
    caught = _run(test, planted, tmp_path)
    assert "1 failed" in caught.stdout and message in caught.stdout, caught.stdout[-2000:]
    other = next(p for sig, (_, p, _) in CASES.items() if sig != signature)
    assert _run(test, other, tmp_path).returncode == 0  # the other kind's bug is not this test's business


def test_the_other_exports_keep_no_resource_code():
    """The resource assertions' helpers appear only in the tests that assert them."""
    case = corpus.load_case(ROOT / "corpus/upstream/spec_pad_clipped_by_long_prefill_threshold/"
                                   "spec_pad_clipped_by_long_prefill_threshold.json")
    assert "def check_pool" not in export.test_source(case)
