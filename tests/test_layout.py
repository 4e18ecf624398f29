"""The package layout says which parts touch vLLM (mambafuzz/__init__.py): the input model imports
no vLLM, and only the groups that must reach vLLM import it. (That every module lives in one of
the layers, and that imports point down only: tests/test_layers.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "mambafuzz"


def test_the_input_model_imports_no_vllm():
    code = ("import sys, mambafuzz.model.scenario, mambafuzz.model.inputs, mambafuzz.model.generate, mambafuzz.model.step_plan;"
            "print(sorted(m for m in ('vllm', 'torch', 'mambafuzz.sim') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_search_and_store_groups_reach_vllm_only_through_the_simulation():
    """A campaign's own machinery (supervisor, minimizer, corpus) must not import vLLM names: a
    vLLM upgrade touches `mambafuzz.sim` (and the conformance and engine tiers), not these."""
    allowed = {"search/coverage_map.py",  # maps coverage onto vLLM's own source files
               "search/triage.py",  # records the vLLM version a finding was filed on
               "search/pr/against_base.py",  # records the vLLM version a pre-existing finding was seen on
               "store/vllm_expectations.py",  # a case's verdicts on the installed vLLM's version
               "search/startup.py"}  # a process's start-up step turns Triton's CPU shim on
    offenders = []
    for group in ("search", "store", "model"):
        for path in sorted((PKG / group).rglob("*.py")):
            rel = str(path.relative_to(PKG))
            if "vllm_compat" in path.read_text() and rel not in allowed:
                offenders.append(rel)
    assert not offenders, offenders
