"""The compatibility layer: only it imports vLLM; it finds moved names, reports missing ones
in one line, and detects features from what the installed vLLM has."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from mambafuzz.exit_codes import EXIT_TOOL
from mambafuzz.sim.bridge.vllm_compat import VllmUnsupported, features
from mambafuzz.sim.bridge.vllm_compat.resolve import Missing, check_all, resolve
from mambafuzz.sim.bridge.vllm_compat.symbols import OPTIONAL, SYMBOLS, Place

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / "mambafuzz" / "sim" / "bridge" / "vllm_compat"


def _imports_vllm(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "vllm" or a.name.startswith("vllm.") for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "vllm" or node.module.startswith("vllm.")):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) and str(
                node.args[0].value).startswith("vllm"):
            lines.append(node.lineno)
    return lines


def test_only_the_compat_layer_imports_vllm():
    offenders = []
    for path in sorted((ROOT / "mambafuzz").rglob("*.py")):
        if COMPAT in path.parents:
            continue
        for line in _imports_vllm(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert not offenders, "import vLLM through mambafuzz.sim.bridge.vllm_compat.api instead: " + ", ".join(offenders)


def test_the_scan_sees_every_form_of_import():
    src = "import vllm\nfrom vllm.config import X\nimport importlib\nimportlib.import_module('vllm.v1')\nimport os\n"
    assert _imports_vllm(ast.parse(src)) == [1, 2, 4]


# ---- resolution against fake vLLM modules -------------------------------------------------------

def _fake_importer(modules: dict[str, dict[str, object]], version: str = "9.9.fake"):
    """An importer over a fake vLLM: `modules` maps module names to their attributes."""
    mods = {"vllm": {"__version__": version, "__file__": "/fake/vllm/__init__.py"}, **modules}

    def importer(name: str) -> types.ModuleType:
        if name not in mods:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        m = types.ModuleType(name)
        m.__dict__.update(mods[name])
        return m
    return importer


def test_a_moved_name_is_found_at_its_new_place():
    grouping = object()
    new_place = _fake_importer({"vllm.v1.core.kv_cache_planning": {"_get_kv_cache_groups_uniform_page_size": grouping}})
    old_place = _fake_importer({"vllm.v1.core.kv_cache_utils": {"_get_kv_cache_groups_uniform_page_size": grouping}})
    assert resolve("get_kv_cache_groups_uniform_page_size", new_place) is grouping
    assert resolve("get_kv_cache_groups_uniform_page_size", old_place) is grouping


def test_a_missing_required_name_is_one_line_naming_it_and_the_vllm():
    importer = _fake_importer({"vllm.v1.core.kv_cache_utils": {}})
    with pytest.raises(VllmUnsupported) as info:
        resolve("get_kv_cache_groups_uniform_page_size", importer)
    msg = str(info.value)
    assert "\n" not in msg
    assert "get_kv_cache_groups_uniform_page_size" in msg and "vLLM 9.9.fake at /fake/vllm" in msg
    assert "vllm.v1.core.kv_cache_planning._get_kv_cache_groups_uniform_page_size" in msg


def test_a_missing_optional_name_is_a_falsy_stand_in_that_raises_when_called():
    importer = _fake_importer({"vllm.v1.kv_cache_interface": {}})
    fn = resolve("get_mamba_prefill_checkpoint_position", importer)
    assert isinstance(fn, Missing) and not fn
    with pytest.raises(VllmUnsupported, match="lacks get_mamba_prefill_checkpoint_position"):
        fn(1, 2)


def test_no_vllm_at_all_says_so():
    def importer(name):
        raise ModuleNotFoundError("No module named 'vllm'", name="vllm")
    with pytest.raises(VllmUnsupported, match="not installed"):
        resolve("Scheduler", importer)


def test_a_module_that_exists_but_fails_to_import_is_reported_with_its_error():
    base = _fake_importer({})

    def importer(name):
        if name == "vllm.config":
            raise ImportError("operator torchvision::nms does not exist")
        return base(name)
    with pytest.raises(VllmUnsupported, match="importing vllm.config fails: ImportError: operator torchvision"):
        resolve("CacheConfig", importer)


def test_check_all_lists_only_the_optional_names_a_vllm_lacks():
    everything: dict[str, dict[str, object]] = {}
    for name, places in SYMBOLS.items():
        p = places[-1]
        everything.setdefault(p.module, {})
        if p.attr is not None and name not in OPTIONAL:
            everything[p.module][p.attr] = object()
    assert sorted(check_all(_fake_importer(everything))) == sorted(OPTIONAL)
    del everything["vllm.v1.engine.llm_engine"]["LLMEngine"]
    assert sorted(check_all(_fake_importer(everything))) == sorted(OPTIONAL)  # the harness runs without it
    with pytest.raises(VllmUnsupported, match="lacks LLMEngine"):
        check_all(_fake_importer(everything), engine_tier=True)


def test_every_place_names_a_vllm_module():
    assert all(p.module == "vllm" or p.module.startswith("vllm.") for ps in SYMBOLS.values() for p in ps)
    assert all(isinstance(p, Place) for ps in SYMBOLS.values() for p in ps)


# ---- feature detection --------------------------------------------------------------------------

@dataclasses.dataclass
class _OldSpec:
    block_size: int
    num_speculative_blocks: int = 0


@dataclasses.dataclass
class _NewSpec(_OldSpec):
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None


OFF = {"num_prefill_checkpoint_blocks": (0,), "prefill_checkpoint_alignment": (None,)}


def test_fit_kwargs_passes_what_the_class_accepts():
    wanted = {"block_size": 64, "num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 16}
    assert features.fit_kwargs(_NewSpec, wanted, OFF, "vLLM new") == wanted


def test_fit_kwargs_drops_an_absent_knob_left_off():
    wanted = {"block_size": 64, "num_prefill_checkpoint_blocks": 0, "prefill_checkpoint_alignment": None}
    assert features.fit_kwargs(_OldSpec, wanted, OFF, "vLLM old") == {"block_size": 64}


def test_fit_kwargs_refuses_an_absent_knob_that_is_set():
    wanted = {"block_size": 64, "num_prefill_checkpoint_blocks": 1}
    with pytest.raises(features.FeatureAbsent, match=r"vLLM old has no _OldSpec.num_prefill_checkpoint_blocks"):
        features.fit_kwargs(_OldSpec, wanted, OFF, "vLLM old")


def test_the_prefill_checkpoint_rule_needs_the_functions_and_the_knobs():
    fn = object()
    gone = Missing("get_mamba_prefill_checkpoint_position", "absent")
    assert features.has_prefill_checkpoint_rule(_NewSpec, fn, fn)
    assert not features.has_prefill_checkpoint_rule(_OldSpec, fn, fn)
    assert not features.has_prefill_checkpoint_rule(_NewSpec, gone, fn)


# ---- the CLI on an unsupported vLLM -------------------------------------------------------------

def _fake_vllm_tree(tmp_path: Path) -> Path:
    """A vLLM that imports but has nothing mambafuzz needs."""
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '0.0.fake'\n")
    (pkg / "config.py").write_text("")
    return tmp_path


def test_the_cli_says_what_an_unsupported_vllm_lacks_in_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{_fake_vllm_tree(tmp_path)}{os.pathsep}{ROOT}"}
    case = ROOT / "corpus" / "regressions" / "first_chunk_fragmented.json"
    proc = subprocess.run([sys.executable, "-m", "mambafuzz.cli.main", "repro", str(case)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == EXIT_TOOL, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("mambafuzz: vLLM 0.0.fake at ") and "lacks CacheConfig" in lines[0]


def test_version_names_both_and_the_vllm_path(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{_fake_vllm_tree(tmp_path)}{os.pathsep}{ROOT}"}
    proc = subprocess.run([sys.executable, "-m", "mambafuzz.cli.main", "--version"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("mambafuzz ") and f"vLLM 0.0.fake at {tmp_path / 'vllm'}" in proc.stdout


# ---- detection on other installed releases (each in its own interpreter) ------------------------

_PROBE = """
import dataclasses, importlib, json
import vllm
from mambafuzz.sim.bridge import configs
kvi = importlib.import_module("vllm.v1.kv_cache_interface")
fields = {f.name for f in dataclasses.fields(kvi.MambaSpec)}
print(json.dumps({"version": vllm.__version__, "file": vllm.__file__, "detected": configs.PREFILL_CHECKPOINTS,
                  "has_function": hasattr(kvi, "get_mamba_prefill_checkpoint_position"),
                  "has_alignment": "prefill_checkpoint_alignment" in fields}))
"""


def _other_envs():
    from mambafuzz.tools.vllm_envs import discover

    others = [e for e in discover() if e.name != "current"]
    if not others:
        return [pytest.param(None, marks=pytest.mark.skip(
            reason="no other vLLM environment: run `ci/setup.sh --vllm 0.29.0` or set MAMBAFUZZ_VLLM_ENVS"))]
    return [pytest.param(e, id=e.name) for e in others]


@pytest.mark.parametrize("env", _other_envs())
def test_detection_and_a_replay_on_another_release(env):
    proc = subprocess.run([env.python, "-c", _PROBE], env=env.environ(), cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["detected"] == (got["has_function"] and got["has_alignment"]), got
    case = ROOT / "corpus" / "regressions" / "first_chunk_fragmented.json"
    run = env.run_cli(["repro", "--json", str(case)], 600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["verdict"] == "clean"
