"""Model Runner V1's accepted-count rule comes from vLLM's own InputBatch, once per patch state."""

from __future__ import annotations

from pathlib import Path

from mambafuzz.checks.pipeline import evaluate
from mambafuzz.sim import patching
from mambafuzz.sim.bridge.vllm_compat.features import has_v1_accepted_probe
from mambafuzz.sim.worker import v1_accepted_probe
from mambafuzz.sim.worker.runners import V1Runner, V2Runner
from mambafuzz.store.corpus import load_case

FINDING = Path(__file__).resolve().parents[2] / "corpus" / "upstream" / "v1_unscheduled_step_forgets_accepted_tokens"
CASE = FINDING / "v1_unscheduled_step_forgets_accepted_tokens.json"


def test_vllm_0_32_v1_resets_and_the_fix_keeps_the_count():
    assert V1Runner.resets_accepted_when_unscheduled is True
    assert V2Runner.resets_accepted_when_unscheduled is False
    with patching.applied(patching.load_patches(str(FINDING / "fix.py"))):
        assert V1Runner.resets_accepted_when_unscheduled is False
    assert V1Runner.resets_accepted_when_unscheduled is True


def test_the_probe_runs_once_per_patch_state_not_per_scenario():
    scenario = load_case(CASE).scenario
    V1Runner.resets_accepted_when_unscheduled  # noqa: B018  (this process's unpatched answer, cached)
    before = v1_accepted_probe.probe_runs
    for _ in range(3):
        assert evaluate(scenario, "fixed", efficiency=False, runner="v1").verdict.kind == "nocache_stale_read"
    assert v1_accepted_probe.probe_runs == before
    patches = patching.load_patches(str(FINDING / "fix.py"))
    for _ in range(3):
        assert evaluate(scenario, "fixed", efficiency=False, runner="v1", patches=patches).verdict.clean
    assert v1_accepted_probe.probe_runs <= before + 1


def test_without_a_v1_batch_the_mirrored_rule_holds(monkeypatch):
    monkeypatch.setattr(v1_accepted_probe, "_probed", lambda: None)
    monkeypatch.setattr(v1_accepted_probe, "probe_keeps_accepted", lambda: (_ for _ in ()).throw(AssertionError))
    assert V1Runner.resets_accepted_when_unscheduled is v1_accepted_probe.MIRRORED_RESET is True
    assert "mirrored" in v1_accepted_probe.rule_source()


def test_feature_detection_needs_the_batch_methods():
    class OldBatch:
        def add_request(self, request): ...

    assert not has_v1_accepted_probe(OldBatch, object)
    from mambafuzz.sim.bridge.vllm_compat.api import CachedRequestState, InputBatch

    assert has_v1_accepted_probe(InputBatch, CachedRequestState)


def test_the_batch_is_built_for_releases_that_require_the_kernel_block_sizes(monkeypatch):
    """vLLM 0.27 to 0.31's InputBatch requires `kernel_block_sizes`; 0.32's has no such argument.
    Without it the probe (and V1 conformance) was a tool failure on those releases."""
    from mambafuzz.sim.worker import v1_input_batch

    built = {}

    class OldBatch:
        def __init__(self, *, max_num_reqs, max_model_len, max_num_batched_tokens, device, vocab_size,
                     block_sizes, kernel_block_sizes, max_num_blocks_per_req, num_spec_tokens=0):
            built.update(block_sizes=block_sizes, kernel_block_sizes=kernel_block_sizes)

    class NewBatch:
        def __init__(self, *, max_num_reqs, max_model_len, max_num_batched_tokens, device, vocab_size,
                     block_sizes, max_num_blocks_per_req, num_spec_tokens=0):
            built.update(block_sizes=block_sizes, kernel_block_sizes=None)

    args = dict(max_num_reqs=2, max_model_len=64, max_num_batched_tokens=64, vocab_size=16, block_size=16,
                max_blocks=4, num_spec_tokens=1)
    monkeypatch.setattr(v1_input_batch, "InputBatch", OldBatch)
    v1_input_batch.new_input_batch(**args)
    assert built == {"block_sizes": [16], "kernel_block_sizes": [16]}
    monkeypatch.setattr(v1_input_batch, "InputBatch", NewBatch)
    v1_input_batch.new_input_batch(**args)
    assert built == {"block_sizes": [16], "kernel_block_sizes": None}
