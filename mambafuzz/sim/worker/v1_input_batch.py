"""Building vLLM's real Model Runner V1 persistent batch (`InputBatch`, gpu_input_batch.py) on
CPU, and the per-request state it is fed (`CachedRequestState`). Shared by the conformance tier
(mambafuzz/conform/v1.py) and the accepted-count probe (mambafuzz/sim/worker/v1_accepted_probe.py), so both call
the same constructor the same way."""

from __future__ import annotations

from typing import Any

import torch

from mambafuzz.sim.bridge.vllm_compat.api import CachedRequestState, InputBatch, SamplingParams
from mambafuzz.sim.bridge.vllm_compat.features import init_params

CPU = torch.device("cpu")


def new_input_batch(*, max_num_reqs: int, max_model_len: int, max_num_batched_tokens: int, vocab_size: int,
                    block_size: int, max_blocks: int, num_spec_tokens: int) -> Any:
    """A one-KV-group InputBatch on CPU, as GPUModelRunner builds it (gpu_model_runner.py). vLLM
    0.27 to 0.31 also require the kernel's block size per group; unsplit, it is the group's own."""
    extra = {"kernel_block_sizes": [block_size]} if "kernel_block_sizes" in init_params(InputBatch) else {}
    return InputBatch(
        max_num_reqs=max_num_reqs, max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens,
        device=CPU, vocab_size=vocab_size, block_sizes=[block_size], max_num_blocks_per_req=[max_blocks],
        num_spec_tokens=num_spec_tokens, **extra,
    )


def greedy_sampling() -> Any:
    return SamplingParams(temperature=0.0, max_tokens=1)


def cached_request(req_id: str, num_prompt_tokens: int, block_ids: list[int], num_computed: int,
                   sampling: Any) -> Any:
    """The runner's CachedRequestState for a request (what `_update_states` creates for a new one)."""
    return CachedRequestState(
        req_id=req_id, prompt_token_ids=[0] * num_prompt_tokens, mm_features=[], sampling_params=sampling,
        generator=None, block_ids=(list(block_ids),), num_computed_tokens=num_computed, output_token_ids=[],
    )
