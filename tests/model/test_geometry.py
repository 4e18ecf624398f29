"""One scenario on smaller blocks (mambafuzz.model.geometry): every declared length scales with the
mamba block by one ratio; steps, output counts and block counts do not."""

from __future__ import annotations

import dataclasses

from mambafuzz.model import geometry
from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario, knobs, validate


def _case() -> Scenario:
    """A chunk that ends one and a half 256-token blocks in, on a 16-token hash grid."""
    return Scenario(
        engine=EngineConfig(mamba_block_size=256, attn_block_size=64, prefix_match_unit=16, max_num_batched_tokens=384,
                            long_prefill_token_threshold=128, num_prefill_checkpoint_blocks=1,
                            prefill_checkpoint_alignment=32, prefix_cache_retention_interval=512, num_gpu_blocks=900,
                            max_num_seqs=3, num_speculative_tokens=2, spec_method="mtp"),
        prefixes=[512, 100],
        requests=[RequestSpec(arrival_step=2, prefix_ids=[0, 1], unique_len=28, max_tokens=9, external_tokens=256),
                  RequestSpec(prefix_ids=[1], unique_len=0, max_tokens=3, continues=0, continue_outputs=5)],
        acceptance=[1, 2])


def test_the_grid_and_budget_knobs_are_declared_lengths_and_counts_are_not():
    lengths = {n for n, k in knobs().items() if k.length}
    assert lengths == {"mamba_block_size", "attn_block_size", "prefix_match_unit", "max_num_batched_tokens",
                       "long_prefill_token_threshold", "prefill_checkpoint_alignment", "prefix_cache_retention_interval"}
    assert geometry.request_lengths() == ("unique_len", "external_tokens")


def test_every_declared_length_scales_by_the_blocks_ratio_and_nothing_else_moves():
    s = _case()
    small = geometry.scaled(s, 8)  # ratio 1/32
    e = small.engine
    assert (e.mamba_block_size, e.attn_block_size, e.prefix_match_unit, e.max_num_batched_tokens,
            e.long_prefill_token_threshold, e.prefill_checkpoint_alignment, e.prefix_cache_retention_interval) == (
        8, 2, 1, 12, 4, 1, 16)
    assert small.prefixes == [16, 3]  # 100/32 rounds to 3
    assert [(r.unique_len, r.external_tokens) for r in small.requests] == [(1, 8), (0, 0)]  # 28/32 rounds to 1
    for name, k in knobs().items():
        if not k.length:
            assert getattr(e, name) == getattr(s.engine, name), name
    unscaled = ("arrival_step", "prefix_ids", "max_tokens", "continues", "continue_outputs", "external_async")
    for before, after in zip(s.requests, small.requests):
        assert [getattr(after, f) for f in unscaled] == [getattr(before, f) for f in unscaled]
    assert (small.acceptance, small.token_seed) == (s.acceptance, s.token_seed)
    assert s.engine.mamba_block_size == 256 and s.prefixes == [512, 100]  # a copy
    assert validate(small) == []


def test_zero_stays_off_and_a_nonzero_length_never_rounds_to_nothing():
    s = dataclasses.replace(_case(), prefixes=[3, 100])
    s.engine.long_prefill_token_threshold = 0
    s.requests[0].external_tokens = 0
    s.requests[0].unique_len = 3  # 3/32 of a token
    small = geometry.scaled(s, 8)
    assert small.engine.long_prefill_token_threshold == 0 and small.requests[0].external_tokens == 0
    assert small.prefixes[0] == 1 and small.engine.prefix_match_unit == 1 and small.requests[0].unique_len == 1


def test_smaller_blocks_run_from_the_smallest_vllm_accepts_up_to_the_current_and_its_half():
    assert geometry.smaller_blocks(400) == [8, 16, 32, 64, 128, 200, 256]
    assert geometry.smaller_blocks(256) == [8, 16, 32, 64, 128]
    assert geometry.smaller_blocks(8) == []
    assert geometry.smaller_blocks(24) == [8, 16]
