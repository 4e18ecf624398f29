"""engine.block_size_from_groups: cache_config.block_size as vLLM 0.32's EngineCore leaves it (the
smallest prefix-cacheable group's block), with the mamba block kept in mamba_block_size; and
what the real scheduler does with it."""

from __future__ import annotations

from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario
from mambafuzz.sim.bridge import configs


def test_the_engine_core_rule_takes_the_smallest_prefix_cacheable_group():
    off = configs.vllm_config_for(EngineConfig(mamba_block_size=64, attn_block_size=16), 1024)
    on = configs.vllm_config_for(EngineConfig(mamba_block_size=64, attn_block_size=16, block_size_from_groups=True), 1024)
    assert off.cache_config.block_size == 64
    assert (on.cache_config.block_size, on.cache_config.mamba_block_size) == (16, 64)
    groups = configs.kv_cache_config_for(EngineConfig(mamba_block_size=64, attn_block_size=16), 8, 1024).kv_cache_groups
    assert configs.engine_core_block_size(groups) == 16


def _chunk_ends(flag: bool) -> list[int]:
    from mambafuzz.conform.drive import drive

    s = Scenario(engine=EngineConfig(mamba_block_size=64, attn_block_size=16, max_num_batched_tokens=48,
                                     block_size_from_groups=flag),
                 requests=[RequestSpec(unique_len=200, max_tokens=2)])
    return [r.num_computed + r.num_scheduled for st in drive(s, ("v2",)) for r in st.input.rows][:4]


def test_the_real_split_cuts_on_cache_config_block_size():
    """vLLM 0.32's `_mamba_block_aligned_split` aligns to cache_config.block_size
    (scheduler.py:469): on the mamba grid a chunk that starts mid-block stops at the boundary
    (64); on the finer grid of the rule it runs through it (48 -> 96)."""
    assert _chunk_ends(False) == [48, 64, 112, 128]
    assert _chunk_ends(True) == [48, 96, 144, 192]
