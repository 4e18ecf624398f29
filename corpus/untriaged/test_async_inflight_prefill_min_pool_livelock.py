# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression test for async_inflight_prefill_min_pool_livelock (written by hand for mambafuzz's
untriaged folder; the exporter drives only the synchronous Scheduler).

One request, alone, on the smallest pool vLLM's start-up check accepts for its length (attention
blocks of the whole sequence, and 2 + speculative blocks per mamba group in align mode, plus the
null block): under async scheduling with two batches in flight, as EngineCore.step_with_batch_queue
drives it, the request must finish. Synchronously it does.
"""

from collections import deque

import pytest
import torch

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheGroupSpec, MambaSpec
from vllm.v1.outputs import ModelRunnerOutput

from .utils import create_requests, create_scheduler

pytestmark = pytest.mark.cpu_test

BLOCK_SIZE = 64  # mamba and attention
NUM_SPEC = 1  # MTP k=1: one speculative block per mamba group
PROMPT, MAX_TOKENS = 300, 4
# attention cdiv(300 + 4 + 1 + 1, 64) = 5, three mamba groups of 2 + 1, the null block
NUM_BLOCKS = 5 + 3 * (2 + NUM_SPEC) + 1
ROW_INDEX = "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__


def hybrid(cls):
    def build(vllm_config, kv_cache_config, **kwargs):  # + 3 mamba groups, align mode
        vllm_config.cache_config.mamba_cache_mode = "align"
        kv_cache_config.prefix_cache_retention_interval = 0
        # an MTP drafter is EAGLE-like: the scheduler drops the last block of a hit (ngram_gpu stands in
        # for it only because create_scheduler cannot build an MTP drafter's config without its model)
        object.__setattr__(vllm_config.speculative_config, "use_eagle", lambda: True)
        mamba = MambaSpec(block_size=BLOCK_SIZE, shapes=((1, 1),), dtypes=(torch.float32,),
                          mamba_cache_mode="align", num_speculative_blocks=NUM_SPEC,
                          num_prefill_checkpoint_blocks=0, prefill_checkpoint_alignment=None)
        kv_cache_config.kv_cache_groups += [KVCacheGroupSpec([f"mamba.{i}"], mamba) for i in range(3)]
        return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config, **kwargs)
    return build


def run(async_scheduling: bool, steps: int = 200) -> tuple[bool, int]:
    """(finished, preemptions) after `steps` engine steps."""
    scheduler = create_scheduler(block_size=BLOCK_SIZE, enable_prefix_caching=True, num_blocks=NUM_BLOCKS,
                                 max_num_batched_tokens=BLOCK_SIZE, max_model_len=PROMPT + MAX_TOKENS + NUM_SPEC + 1,
                                 num_speculative_tokens=NUM_SPEC, speculative_method="ngram_gpu",
                                 async_scheduling=async_scheduling,
                                 scheduler_cls=hybrid(AsyncScheduler if async_scheduling else Scheduler))
    request = create_requests(1, PROMPT, max_tokens=MAX_TOKENS, block_size=BLOCK_SIZE)[0]
    scheduler.add_request(request)
    depth = 2 if async_scheduling else 1
    in_flight: deque = deque()  # (SchedulerOutput, ids of the rows that sample)
    preemptions = 0
    for _ in range(steps):
        if scheduler.has_requests() and len(in_flight) < depth:
            output = scheduler.schedule()
            preemptions += len(output.preempted_req_ids or ())
            sampling = [r for r in output.num_scheduled_tokens
                        if request.num_computed_tokens >= request.num_prompt_tokens]
            in_flight.appendleft((output, sampling))
            if len(in_flight) < depth and (output.num_scheduled_tokens or scheduler.has_requests()):
                continue
        if not in_flight:
            break
        output, sampling = in_flight.pop()
        ids = list(output.num_scheduled_tokens)
        index = {"req_id_to_index": {r: i for i, r in enumerate(ids)}} if ROW_INDEX else {}  # gone in 0.34
        scheduler.update_from_output(output, ModelRunnerOutput(
            req_ids=ids, sampled_token_ids=[[7] if r in sampling else [] for r in ids], **index))
    return request.is_finished(), preemptions


def test_lone_request_finishes_synchronously():
    assert run(async_scheduling=False) == (True, 0)


def test_async_inflight_prefill_min_pool_livelock():
    finished, preemptions = run(async_scheduling=True)
    assert finished, f"a lone request never finished on a {NUM_BLOCKS}-block pool: preempted {preemptions} times"
