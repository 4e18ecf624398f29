"""The pool floor a scenario may name (mambafuzz.model.scenario.min_pool_blocks) against vLLM's own
start-up minimum (mambafuzz.sim.bridge.configs.startup_min_blocks, the engine's per-group check):
equal to it, so no drawn pool is one vLLM refuses and the generators reach the tightest pool vLLM
starts with; and the bridge's minimum is the one vLLM's own check computes."""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest

from mambafuzz.model.architectures import DEFAULT_MODEL, MODELS
from mambafuzz.model.generate import random_scenario
from mambafuzz.model.scenario import (
    EngineConfig,
    RequestSpec,
    Scenario,
    blocks_for_request,
    min_pool_blocks,
    startup_pool_blocks,
    validate,
)
from mambafuzz.sim.bridge import configs
from mambafuzz.sim.engine import harness


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("spec,ckpt", [(0, 0), (2, 0), (0, 1)])
def test_floor_is_vllms_startup_minimum(model, caching, spec, ckpt):
    e = EngineConfig(model=model, enable_prefix_caching=caching, spec_method="mtp" if spec else "none",
                     num_speculative_tokens=spec, num_prefill_checkpoint_blocks=ckpt if caching else 0,
                     mamba_block_size=1600, attn_block_size=1600, max_num_batched_tokens=2048)
    for max_model_len in (1, 1600, 1601, 5000):
        ours, vllms = startup_pool_blocks(e, max_model_len), configs.startup_min_blocks(e, max_model_len)
        assert ours == vllms, (max_model_len, ours, vllms)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("spec,ckpt", [(0, 0), (2, 1)])
def test_the_bridges_minimum_is_the_one_vllms_engine_check_computes(model, spec, ckpt):
    """vLLM 0.32's engine checks memory per KV-cache group (`get_kv_cache_configs` ->
    `_max_memory_usage_bytes_from_groups`, which charges a padded group its padding) after holding
    the null block back: the smallest pool it starts with is the smallest N whose memory, N blocks
    at the pool's bytes per block, passes that check. Until 2026-12-06 the bridge summed
    `max_memory_usage_bytes` per layer instead (the helper nothing in the engine calls), one block
    short on padded layouts (Qwen3-Next-80B with MTP): a pool vLLM refuses looked like one it
    accepts, and the capacity oracle filed it."""
    from vllm.v1.core import kv_cache_utils as kvu

    e = EngineConfig(model=model, spec_method="mtp" if spec else "none", num_speculative_tokens=spec,
                     num_prefill_checkpoint_blocks=ckpt, mamba_block_size=8, attn_block_size=8,
                     max_num_batched_tokens=64)
    for max_model_len in (238, 1601):
        groups = configs.kv_cache_config_for(e, 1, max_model_len).kv_cache_groups
        vc = copy.copy(configs.at_max_model_len(configs.checked_config(e, max_model_len, False), max_model_len))
        vc.cache_config = copy.copy(vc.cache_config)
        vc.cache_config.kv_cache_layout = "BLHNC"  # the engine core resolves one; the minimum does not depend on it
        per_block = kvu._pool_bytes_per_block(vc, groups)
        need = kvu._max_memory_usage_bytes_from_groups(vc, groups)
        smallest = next(n for n in range(1, 100_000) if n * per_block - per_block >= need)
        assert configs.startup_min_blocks(e, max_model_len) == smallest, (model, max_model_len)


def test_generated_scenarios_floor_matches_vllm():
    rng = random.Random(3)
    checked = 0
    while checked < 60:
        s = random_scenario(rng)
        if validate(s) or s.engine.model != DEFAULT_MODEL:
            continue
        assert min_pool_blocks(s) == configs.startup_min_blocks(s.engine, s.max_model_len())
        checked += 1


def test_a_single_request_runs_at_the_floor():
    """At vLLM's minimum, one request alone (no prefix sharing, block-grained matching, synchronous
    scheduling) finishes in both runs: the floor is a pool vLLM can serve, not one that stalls by itself."""
    e = EngineConfig(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=128, async_scheduling=False)
    s = Scenario(e, prefixes=[], requests=[RequestSpec(0, [], 300, 8)], token_seed=1)
    s = dataclasses.replace(s, engine=dataclasses.replace(e, num_gpu_blocks=min_pool_blocks(s)))
    assert not validate(s)
    for caching in (True, False):
        trace = harness.run(s, prefix_caching=caching)
        assert not trace.unfinished and trace.crash is None


def test_below_the_floor_is_refused_in_one_line():
    s = random_scenario(random.Random(0))
    s = dataclasses.replace(s, engine=dataclasses.replace(s.engine, num_gpu_blocks=min_pool_blocks(s) - 1))
    problems = validate(s)
    assert len(problems) == 1 and "start-up minimum" in problems[0] and "\n" not in problems[0]


def test_generators_draw_pools_below_the_old_floor():
    """The band between vLLM's start-up minimum and the floor mambafuzz used before (one block per
    mamba block of the longest request, plus slack) is drawn: the pools where a lone request's
    peak use can exceed what vLLM's start-up check reserves."""
    rng = random.Random(5)
    tight = drawn = 0
    for _ in range(400):
        s = random_scenario(rng)
        if validate(s) or s.engine.num_gpu_blocks is None:
            continue
        drawn += 1
        assert s.engine.num_gpu_blocks >= min_pool_blocks(s)
        longest = s.max_model_len()
        if s.engine.num_gpu_blocks < blocks_for_request(s.engine, longest):
            tight += 1
    assert drawn and tight, (drawn, tight)
