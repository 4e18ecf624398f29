"""Exported tests stand alone (vLLM APIs only), fail on the installed vLLM and pass with the
finding's candidate fix; the committed ones are what the exporter writes today."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mambafuzz.findings import export_assertion
from mambafuzz.store import corpus
from mambafuzz.upstream import export

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "corpus" / "upstream"
# exports need a fix; a case that fails only under async scheduling has none (the standalone test
# drives the synchronous Scheduler): test_a_crash_that_needs_async_scheduling_is_refused_in_one_line
ALL_CASES = sorted(p for p in UPSTREAM.rglob("*.json") if (p.parent / "fix.py").is_file())
# a finding whose kind has no exported assertion yet (an oracle without `export` for its location)
NO_ASSERTION = [p for p in ALL_CASES if export_assertion(json.loads(p.read_text()).get("finding", {}).get("signature", "")) is None
                and json.loads(p.read_text()).get("finding")]
ASYNC_ONLY = [p for p in ALL_CASES if json.loads(p.read_text())["engine"].get("async_scheduling", False) is not False
              and not (p.parent / f"test_{p.stem}.py").is_file() and p not in NO_ASSERTION]
CASES = [p for p in ALL_CASES if p not in ASYNC_ONLY and p not in NO_ASSERTION]


def exported(path: Path) -> Path:
    return path.parent / f"test_{path.stem}.py"


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_committed_export_is_current_and_imports_no_mambafuzz(path):
    case = corpus.load_case(path)
    source = export.test_source(case, export.finding_analysis(export.fix_dir(case))[0])
    assert exported(path).read_text() == source, f"re-run: mambafuzz export-test {path} -o {exported(path)}"
    assert "import mambafuzz" not in source and "from fuzz" not in source


@pytest.mark.parametrize("path", ASYNC_ONLY, ids=lambda p: p.stem)
def test_a_crash_that_needs_async_scheduling_is_refused_in_one_line(path):
    # refused for needing async scheduling (the in-flight capacity case: its assertion exists, the standalone
    # test's synchronous Scheduler holds no batch in flight): one line
    with pytest.raises(export.ExportError, match=r"needs async scheduling, and the standalone test drives the synchronous"):
        export.test_source(corpus.load_case(path))


@pytest.mark.parametrize("path", NO_ASSERTION, ids=lambda p: p.stem)
def test_a_finding_without_an_assertion_is_refused_in_one_line(path):
    with pytest.raises(export.ExportError, match=r"^no scheduler-side assertion for [^\n]*yet$"):
        export.test_source(corpus.load_case(path))


def _pytest(files: list[Path], fix: Path | None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(ROOT),
           "-o", "addopts=", *map(str, files)]
    if fix is not None:
        env["MAMBAFUZZ_PATCHES"] = str(fix)
        cmd[3:3] = ["-p", "mambafuzz.upstream.fix_plugin"]
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


# --style vllm: short tests in vLLM's idiom, run inside vLLM's own test tree (ci/vllm-tests).
# The cases it refuses, each with its one-line reason (a connector vLLM's helpers cannot state,
# MTP on create_scheduler's OPT model, a priority policy create_scheduler does not set).
VLLM_REFUSED = {"internal_checkpoint_exemption_outlives_junction_clip", "internal_checkpoint_midblock_resume_connector",
                "internal_checkpoint_poison_read_back", "connector_admission_estimate_short_per_mamba_group",
                "priority_preemption_serves_uncomputed_blocks"}
VLLM_CASES = [p for p in CASES if p.stem not in VLLM_REFUSED]
# A test with mamba groups carries the scheduler_cls that adds them (create_scheduler builds one
# attention group): it and its imports come on top of the short test's 60.
HYBRID_HELPER_LINES = 13
# create_scheduler loads facebook/opt-125m's config; offline, this stand-in is all it reads
OPT_125M_CONFIG = ('{"architectures": ["OPTForCausalLM"], "model_type": "opt", "vocab_size": 50272, '
                   '"hidden_size": 768, "num_hidden_layers": 12, "ffn_dim": 3072, "num_attention_heads": 12, '
                   '"max_position_embeddings": 2048, "word_embed_proj_dim": 768, "do_layer_norm_before": true, '
                   '"torch_dtype": "float16", "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1}')


def vllm_helpers() -> Path:
    """vLLM's tests/ subset for the installed release, or a skip that says how to get it."""
    import vllm

    version = vllm.__version__.split("+")[0]
    tree = Path(os.environ.get("MAMBAFUZZ_VLLM_TESTS", ROOT / ".vllm-tests" / version))
    if not (tree / "tests" / "v1" / "core" / "utils.py").is_file():
        pytest.skip(f"vLLM {version}'s test helpers are not in {tree}: run ci/vllm-tests")
    return tree


@pytest.mark.parametrize("path", VLLM_CASES, ids=lambda p: p.stem)
def test_vllm_style_export_is_short_marked_and_imports_no_mambafuzz(path):
    source = export.vllm_test_source(corpus.load_case(path), "T")
    assert len(source.splitlines()) <= 60 + (HYBRID_HELPER_LINES if "def hybrid_scheduler(" in source else 0)
    assert "pytestmark = pytest.mark.cpu_test" in source
    assert "import mambafuzz" not in source and "from fuzz" not in source


@pytest.mark.parametrize("path", sorted(set(CASES) - set(VLLM_CASES)), ids=lambda p: p.stem)
def test_vllm_style_refuses_what_vllms_helpers_cannot_state_in_one_line(path):
    with pytest.raises(export.ExportError, match=r"^--style vllm cannot express [^\n]*\(use --style standalone\)$"):
        export.vllm_test_source(corpus.load_case(path))


def _vllm_tree_with_exports(tmp_path: Path, helpers: Path, sources: dict[Path, str] | None = None) -> list[Path]:
    """vLLM's tests/ tree in `tmp_path` with each case's --style vllm test in tests/v1/core
    (`sources`: case -> test source; default: every VLLM_CASES export)."""
    import shutil

    shutil.copytree(helpers / "tests", tmp_path / "tests")
    snapshot = tmp_path / "hf" / "models--facebook--opt-125m" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(OPT_125M_CONFIG)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
    if sources is None:
        sources = {path: export.vllm_test_source(corpus.load_case(path)) for path in VLLM_CASES}
    files = []
    for path, source in sources.items():
        f = tmp_path / "tests" / "v1" / "core" / f"test_{path.stem}.py"
        f.write_text(source)
        files.append(f)
    return files


def _pytest_in(tree: Path, files: list[Path], fix: Path | None) -> subprocess.CompletedProcess:
    # after the tree and this checkout, any vLLM tree already on PYTHONPATH (ci/pr-overlay's 0.33.0)
    path = os.pathsep.join(p for p in (str(tree), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tree / "hf"), PYTHONPATH=path)
    # cpu_gate_plugin: vLLM 0.34's CPU platform refuses this host (no triton-cpu) in any VllmConfig
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "-p", "mambafuzz.upstream.cpu_gate_plugin", "--rootdir", str(tree),
           "-o", "addopts=", "-W", "ignore::pytest.PytestUnknownMarkWarning", *map(str, files)]
    if fix is not None:
        env["MAMBAFUZZ_PATCHES"] = str(fix)
        cmd[3:3] = ["-p", "mambafuzz.upstream.fix_plugin"]
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_vllm_style_exports_fail_without_and_pass_with_their_fix(tmp_path):
    files = _vllm_tree_with_exports(tmp_path, vllm_helpers())
    without = _pytest_in(tmp_path, files, None)
    assert f"{len(files)} failed" in without.stdout, without.stdout[-2000:]
    for path, f in zip(VLLM_CASES, files):
        with_fix = _pytest_in(tmp_path, [f], path.parent / "fix.py")
        assert with_fix.returncode == 0 and "1 passed" in with_fix.stdout, with_fix.stdout[-2000:]


# A stall (stall:step-bound) filed as the output divergence that follows from it: the untriaged
# tied-block case, whose export is committed beside it (corpus/untriaged/README.md). The request's
# async connector load fails under `recompute`, and vLLM 0.32 never schedules it again.
UNTRIAGED = ROOT / "corpus" / "untriaged"
STALL_CASE = UNTRIAGED / "connector_failed_load_recompute_stall_tied.json"
STALL_FIX = UNTRIAGED / "candidate_fix_discard_inflight.py"


@pytest.mark.slow
def test_stall_export_is_current_fails_without_and_passes_with_the_candidate_fix(tmp_path):
    helpers = vllm_helpers()
    source = export.vllm_test_source(corpus.load_case(STALL_CASE))
    assert exported(STALL_CASE).read_text() == source, (
        f"re-run: mambafuzz export-test --style vllm {STALL_CASE} -o {exported(STALL_CASE)}")
    assert "import mambafuzz" not in source and "(stall:step-bound)" in source
    files = _vllm_tree_with_exports(tmp_path, helpers, {STALL_CASE: source})
    without = _pytest_in(tmp_path, files, None)
    assert "1 failed" in without.stdout and "unfinished after 325 steps" in without.stdout, without.stdout[-2000:]
    assert "{'r0': None}" in without.stdout  # the request named, never scheduled
    with_fix = _pytest_in(tmp_path, files, STALL_FIX)
    assert with_fix.returncode == 0 and "1 passed" in with_fix.stdout, with_fix.stdout[-2000:]


# ISSUE.md (export-report) in vLLM's bug-report layout: the template's two sections in its order
# (environment, then the bug), this project's sections after them, the short test inline.
REPORT_SECTIONS = ["## Your current environment", "## Describe the bug", "## Minimal reproducer",
                   "## Expected and actual", "## Evidence"]
SCREEN_LINES = 100  # everything before the collapsed evidence: one screen, the short test included


@pytest.mark.parametrize("stem", ["spec_pad_clipped_by_long_prefill_threshold",  # a --style vllm test
                                  "connector_admission_estimate_short_per_mamba_group"])  # refused: standalone
def test_report_follows_vllms_bug_template_with_the_short_test_inline(stem):
    case = corpus.load_case(next(p for p in CASES if p.stem == stem))
    text = export.report_text(case)
    assert text.startswith("# [Bug]: ")
    assert [line for line in text.splitlines() if line.startswith("## ")] == REPORT_SECTIONS
    reproducer = text.split("## Minimal reproducer\n", 1)[1].split("\n## ", 1)[0]
    title = export.finding_analysis(export.fix_dir(case))[0]
    try:
        test, style = export.vllm_test_source(case, title), "vllm"
    except export.ExportError:
        test, style = export.test_source(case, title), "standalone"
    assert f"```python\n{test.rstrip()}\n```" in reproducer
    assert f"export-test --style {style} " in reproducer
    assert (style == "vllm") == (stem != "connector_admission_estimate_short_per_mamba_group")
    shown, evidence = text.split("## Evidence\n", 1)
    if style == "vllm":  # the standalone test is longer than a screen; the short one is not
        assert len(shown.splitlines()) <= SCREEN_LINES, len(shown.splitlines())
    assert "Related upstream: " in shown and "Candidate fix</summary>" in evidence
    assert evidence.count("<details>") == evidence.count("</details>") == 4


def test_a_case_on_another_model_is_refused_in_one_line():
    case = corpus.load_case(Path(__file__).resolve().parents[2] / "corpus/seeds/nemotron_h_shared_prefix_hits.json")
    with pytest.raises(export.ExportError, match=r"^[^\n]*engine.model nemotron_h_8b cannot be exported yet[^\n]*$"):
        export.test_source(case)


def test_a_case_with_block_size_from_groups_is_refused_in_one_line():
    case = corpus.load_case(ROOT / "corpus/untriaged/finer_group_grid_split_publishes_unaligned_state.json")
    with pytest.raises(export.ExportError, match=r"^[^\n]*engine.block_size_from_groups[^\n]*mambafuzz repro$"):
        export.test_source(case)


@pytest.mark.parametrize("source", [export.test_source, export.vllm_test_source], ids=["standalone", "vllm"])
def test_a_case_with_prefix_cache_resets_is_refused_in_one_line(source):
    case = corpus.load_case(ROOT / "corpus/seeds/prefix_cache_reset_running_and_idle.json")
    with pytest.raises(export.ExportError, match=r"^[^\n]*cannot replay prefix_cache_resets[^\n]*mambafuzz repro$"):
        source(case)
