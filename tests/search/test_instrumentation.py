"""The atheris target's coverage feedback comes from the modules it names, and only from them."""

import subprocess
import sys
from pathlib import Path

import pytest

from mambafuzz.search.fuzz_targets import COVERAGE_MODULES
from mambafuzz.search.instrumentation import under

ROOT = Path(__file__).resolve().parents[2]


def test_under_matches_whole_module_names_only():
    assert under("vllm.v1.core.sched.scheduler", COVERAGE_MODULES)
    assert under("vllm.v1.kv_cache_interface", COVERAGE_MODULES)
    assert not under("vllm.v1.kv_cache_interface_extra", COVERAGE_MODULES)
    assert not under("vllm.config.model", COVERAGE_MODULES)  # atheris' own include would take all of vllm
    assert not under("mambafuzz.checks.oracle", COVERAGE_MODULES)


def test_only_the_named_modules_get_instrumented():
    pytest.importorskip("atheris")
    script = f"""
import sys, types
sys.path.insert(0, {str(ROOT)!r})
from mambafuzz.search.target_runtime import Runtime  # everything the target imports
from mambafuzz.search.fuzz_targets import COVERAGE_MODULES
from mambafuzz.search.instrumentation import instrument_modules
import mambafuzz.checks.oracle, mambafuzz.model.generate, vllm.config
from vllm.v1.core.sched.scheduler import Scheduler
n = instrument_modules(COVERAGE_MODULES)
marked = lambda f: "__ATHERIS_INSTRUMENTED__" in f.__code__.co_consts
assert n > 100, n
assert marked(Scheduler.schedule) and marked(mambafuzz.model.generate.draw_scenario)
assert not marked(mambafuzz.checks.oracle.judge) and not marked(vllm.config.VllmConfig.__post_init__)
print("ok", n)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-2000:]


def test_the_conform_target_also_rewards_the_kernel_model_and_the_conformance_tier():
    from mambafuzz.search import fuzz_targets

    scheduler, conform = (fuzz_targets.get(t).coverage_modules for t in ("scheduler", "conform"))
    for module in ("mambafuzz.sim.worker.kernel_model", "mambafuzz.sim.worker.runners", "mambafuzz.sim.worker.mixers", "mambafuzz.conform.compare", "mambafuzz.conform.v1",
                   "mambafuzz.conform.v2", "mambafuzz.conform.drive"):
        assert under(module, conform) and not under(module, scheduler), module
    assert under("vllm.v1.core.sched.scheduler", conform)
    # vLLM's worker modules stay out: their Triton kernels run in Triton's interpreter as written
    assert not under("vllm.v1.worker.mamba_utils", conform) and not under("mambafuzz.checks.oracle", conform)


def test_instrumenting_the_conform_target_marks_its_modules_only():
    pytest.importorskip("atheris")
    script = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from mambafuzz.search.target_runtime import Runtime  # what the target imports first
from mambafuzz.search.instrumentation import instrument_target
from mambafuzz.search.startup import prepare_worker
from mambafuzz.search.worker_protocol import WorkerConfig
prepare_worker(WorkerConfig(target="conform", conform_kernels=True))  # then its start-up step (the supervisor sets conform_kernels from the target)
n = instrument_target("conform")
import mambafuzz.checks.oracle
from mambafuzz.conform import compare as conform_check, v1 as conform_vllm
from mambafuzz.sim.worker.kernel_model import KernelModel
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.worker import mamba_utils
marked = lambda f: "__ATHERIS_INSTRUMENTED__" in f.__code__.co_consts
assert marked(KernelModel.run_row) and marked(conform_check.compare_steps) and marked(Scheduler.schedule)
assert marked(conform_vllm.V1Worker.step)
assert not marked(mambafuzz.checks.oracle.judge) and not marked(mamba_utils.preprocess_mamba)
print("ok", n)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-2000:]
