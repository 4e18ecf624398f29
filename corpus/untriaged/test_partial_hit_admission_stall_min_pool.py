# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression test for partial_hit_admission_stall_min_pool

Every request must finish within the step bound (one step per token, plus arrivals); a request
the scheduler stops scheduling is named with the last step that scheduled it.
Exported by mambafuzz from partial_hit_admission_stall_min_pool.json (stall:step-bound).
"""

import pytest
import torch

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheGroupSpec, MambaSpec
from vllm.v1.outputs import ModelRunnerOutput

from .utils import create_requests, create_scheduler

pytestmark = pytest.mark.cpu_test

MAMBA_BLOCK_SIZE = 32  # create_scheduler's attention block has the same size
HASH_BLOCK_SIZE = 4  # prefix_match_unit
REQUESTS = {'r0': (0, 13, 1), 'r1': (4, 33, 1)}  # id -> (arrival step, prompt length, max tokens)


def hybrid_scheduler(vllm_config, kv_cache_config, **kwargs):  # + 3 mamba groups, align mode
    vllm_config.cache_config.mamba_cache_mode = "align"
    kv_cache_config.prefix_cache_retention_interval = 0
    mamba = MambaSpec(block_size=MAMBA_BLOCK_SIZE, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align",
                      num_prefill_checkpoint_blocks=0, prefill_checkpoint_alignment=None)
    kv_cache_config.kv_cache_groups += [KVCacheGroupSpec([f"mamba.{i}"], mamba) for i in range(3)]
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     hash_block_size=HASH_BLOCK_SIZE, **kwargs)


def test_partial_hit_admission_stall_min_pool():
    scheduler = create_scheduler(block_size=MAMBA_BLOCK_SIZE, enable_prefix_caching=True,
                                 scheduler_cls=hybrid_scheduler, num_blocks=12,
                                 max_num_batched_tokens=49, max_num_seqs=7)
    requests = {r: create_requests(1, n, max_tokens=m, block_size=HASH_BLOCK_SIZE, req_ids=[r])[0]
                for r, (_, n, m) in REQUESTS.items()}
    last_scheduled = {}  # request id -> the last step that scheduled it
    for step in range(84):
        for req_id in [r for r, (arrival, _, _) in REQUESTS.items() if arrival == step]:
            scheduler.add_request(requests[req_id])
        output = scheduler.schedule()
        last_scheduled.update(dict.fromkeys(output.num_scheduled_tokens, step))
        ids = list(output.num_scheduled_tokens)
        done = [[0] if requests[r].num_computed_tokens >= requests[r].num_tokens else [] for r in ids]
        scheduler.update_from_output(output, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=done))
    stuck = {r: last_scheduled.get(r) for r, request in requests.items() if not request.is_finished()}
    assert not stuck, f"unfinished after 84 steps (request: last step scheduled): {stuck}"
