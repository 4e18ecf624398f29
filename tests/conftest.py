"""Shared builders: small scenarios readable at a glance."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config):
    """Every test process takes the start-up step a `mambafuzz conform` process takes (Triton's CPU
    shim, before any vLLM kernel module is imported), so which test file is collected or run
    first never decides whether the conformance tier can run."""
    from mambafuzz.search.startup import prepare_process

    prepare_process(conform=True)

from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario  # noqa: E402


def drawn_with_and_without(draw: str, seeds) -> tuple[list, list]:
    """The random generator's scenarios for `seeds` with the late draw `draw` and without it, the late
    draws after it left out of both: the two lists differ by `draw` alone."""
    import random

    from mambafuzz.model import generate

    after = generate.draws_from(draw)[1:]
    with generate.late_draws_left_out(after[0] if after else None):
        drawn = [generate.random_scenario(random.Random(seed)) for seed in seeds]
    with generate.late_draws_left_out(draw):
        before = [generate.random_scenario(random.Random(seed)) for seed in seeds]
    return drawn, before

MAMBA_BLOCK_SIZE = 1600
ATTN_BLOCK_SIZE = 16


def first_chunk_scenario() -> Scenario:
    """Prompt 2002 over a 1600-token mamba block, MTP, and a 1300-token neighbour that
    eats the budget: the known-bad first-chunk fragmentation. Dense retention, so vLLM keeps
    (and hashes) the 1600-token boundary the bug poisons."""
    return Scenario(
        engine=EngineConfig(mamba_block_size=MAMBA_BLOCK_SIZE, attn_block_size=ATTN_BLOCK_SIZE, prefix_match_unit=16,
                            max_num_batched_tokens=2048, spec_method="mtp", num_speculative_tokens=1,
                            prefix_cache_retention_interval=None),
        requests=[RequestSpec(unique_len=1300, max_tokens=4), RequestSpec(unique_len=2002, max_tokens=4)],
    )


def shared_prefix_scenario(block: int = 64) -> Scenario:
    """Two requests sharing a prefix; the second arrives after the first has cached it."""
    return Scenario(
        engine=EngineConfig(mamba_block_size=block, attn_block_size=16, max_num_batched_tokens=256),
        prefixes=[3 * block + 10],
        requests=[RequestSpec(prefix_ids=[0], unique_len=5, max_tokens=3),
                  RequestSpec(arrival_step=6, prefix_ids=[0], unique_len=7, max_tokens=3)],
    )


@pytest.fixture
def first_chunk() -> Scenario:
    return first_chunk_scenario()
