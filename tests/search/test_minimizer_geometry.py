"""The minimizer's geometry pass: a finding moves to the smallest mamba block that keeps its signature,
every length scaled with it, so findings of one cause share a geometry and replay each other."""

from __future__ import annotations

from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario
from mambafuzz.search import minimizer


def _mid_block_chunk(s: Scenario) -> bool:
    """Fails only where the first chunk (the whole budget) ends exactly one and a half blocks into
    a longer prompt: a property of the geometry's ratios, not of its size."""
    e, prompt = s.engine, s.prompt_len(0)
    return 2 * e.max_num_batched_tokens == 3 * e.mamba_block_size and prompt > e.max_num_batched_tokens


def test_a_finding_moves_to_the_smallest_block_with_every_length_scaled():
    s = Scenario(engine=EngineConfig(mamba_block_size=256, attn_block_size=16, max_num_batched_tokens=384),
                 requests=[RequestSpec(unique_len=700, max_tokens=4)])
    assert _mid_block_chunk(s)
    small = minimizer.minimize(s, _mid_block_chunk, time_budget=600).scenario
    assert (small.engine.mamba_block_size, small.engine.max_num_batched_tokens) == (8, 12)
    assert small.prompt_len(0) == 13


def test_the_geometry_pass_proposes_each_smaller_block_smallest_first():
    s = Scenario(engine=EngineConfig(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=96),
                 requests=[RequestSpec(unique_len=200)])
    proposed = list(minimizer._scale_geometry(s))
    assert [(c.engine.mamba_block_size, c.engine.attn_block_size, c.engine.max_num_batched_tokens,
             c.requests[0].unique_len) for c in proposed] == [(8, 8, 12, 25), (16, 16, 24, 50), (32, 32, 48, 100)]
