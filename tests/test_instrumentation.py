"""The atheris target's coverage feedback comes from the modules it names, and only from them."""

import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.instrumentation import COVERAGE_MODULES, under

ROOT = Path(__file__).resolve().parent.parent


def test_under_matches_whole_module_names_only():
    assert under("vllm.v1.core.sched.scheduler", COVERAGE_MODULES)
    assert under("vllm.v1.kv_cache_interface", COVERAGE_MODULES)
    assert not under("vllm.v1.kv_cache_interface_extra", COVERAGE_MODULES)
    assert not under("vllm.config.model", COVERAGE_MODULES)  # atheris' own include would take all of vllm
    assert not under("fuzz.oracle", COVERAGE_MODULES)


def test_only_the_named_modules_get_instrumented():
    pytest.importorskip("atheris")
    script = f"""
import sys, types
sys.path.insert(0, {str(ROOT)!r})
from fuzz.target_runtime import Runtime  # everything the target imports
from fuzz.instrumentation import COVERAGE_MODULES, instrument_modules
import fuzz.oracle, fuzz.generate, vllm.config
from vllm.v1.core.sched.scheduler import Scheduler
n = instrument_modules(COVERAGE_MODULES)
marked = lambda f: "__ATHERIS_INSTRUMENTED__" in f.__code__.co_consts
assert n > 100, n
assert marked(Scheduler.schedule) and marked(fuzz.generate.draw_scenario)
assert not marked(fuzz.oracle.judge) and not marked(vllm.config.VllmConfig.__post_init__)
print("ok", n)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-2000:]
