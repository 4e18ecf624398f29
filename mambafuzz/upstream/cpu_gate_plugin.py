"""A pytest plugin that runs exported scheduler-level tests on an x86 CPU host without triton-cpu.

vLLM 0.34's CPU platform refuses such a host while building any VllmConfig (vllm/platforms/cpu.py:
242-243), which stops vLLM's own `create_scheduler` before a scheduler exists. The exported tests
never run a kernel, so where (and only where) that check refuses for want of Triton, it is run again
with vLLM's Triton flag on for its duration (`platform_gate.pass_gate_on_refusal`). A vLLM whose
check passes is untouched. Used by tests/upstream/test_export.py; load it with
`python -m pytest -p mambafuzz.upstream.cpu_gate_plugin ...`. Nothing in an exported test needs it
on a CUDA host or with triton-cpu installed."""

from __future__ import annotations


def pytest_configure(config) -> None:  # noqa: ARG001 (pytest's hook signature)
    from mambafuzz.sim.bridge.vllm_compat.platform_gate import pass_cpu_gate_on_refusal

    pass_cpu_gate_on_refusal()
