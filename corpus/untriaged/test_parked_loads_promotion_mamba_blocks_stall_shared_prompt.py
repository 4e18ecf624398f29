# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Regression test for parked_loads_promotion_mamba_blocks_stall_shared_prompt

Every request must finish within the step bound (one step per token, plus arrivals); a request
the scheduler stops scheduling is named with the last step that scheduled it.
Exported by mambafuzz from parked_loads_promotion_mamba_blocks_stall_shared_prompt.json (stall:step-bound).
"""

import pytest
import torch

from tests.v1.kv_connector.unit.utils import MockKVConnector
from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheGroupSpec, MambaSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import RequestStatus

from .utils import create_requests, create_scheduler, mock_kv

pytestmark = pytest.mark.cpu_test

MAMBA_BLOCK_SIZE = 256  # create_scheduler's attention block has the same size
HASH_BLOCK_SIZE = 4  # prefix_match_unit
REQUESTS = {'r0': (2, 229, 1), 'r1': (2, 919, 1)}  # id -> (arrival step, prompt length, max tokens)
EXTERNAL = {'r0': (228, True), 'r1': (916, True)}  # id -> (connector hit, async load)
FAILED_LOAD = 0  # the n-th async load fails (0: none)


class ScenarioKV(MockKVConnector, SupportsHMA):
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        tokens, is_async = EXTERNAL.get(request.request_id, (0, False))  # never the whole prompt
        new = max(0, min(tokens, request.num_prompt_tokens - 1) - num_computed_tokens)
        return new, is_async and new > 0

    def request_finished_all_groups(self, request, block_ids):
        return False, None


def hybrid_scheduler(vllm_config, kv_cache_config, **kwargs):  # + 3 mamba groups, align mode
    vllm_config.cache_config.mamba_cache_mode = "align"
    kv_cache_config.prefix_cache_retention_interval = 0
    kv = vllm_config.kv_transfer_config
    kv.kv_connector, kv.kv_connector_module_path = "ScenarioKV", __name__
    kv.kv_load_failure_policy = "fail"
    mamba = MambaSpec(block_size=MAMBA_BLOCK_SIZE, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align",
                      num_prefill_checkpoint_blocks=0, prefill_checkpoint_alignment=None)
    kv_cache_config.kv_cache_groups += [KVCacheGroupSpec([f"mamba.{i}"], mamba) for i in range(3)]
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     hash_block_size=HASH_BLOCK_SIZE, **kwargs)


def test_parked_loads_promotion_mamba_blocks_stall_shared_prompt():
    scheduler = create_scheduler(block_size=MAMBA_BLOCK_SIZE, enable_prefix_caching=True,
                                 scheduler_cls=hybrid_scheduler, num_blocks=14,
                                 max_num_batched_tokens=8, max_num_seqs=8, max_model_len=921,
                                 use_kv_connector=mock_kv(matched_tokens=0, is_async=False))
    requests = {r: create_requests(1, n, max_tokens=m, block_size=HASH_BLOCK_SIZE, req_ids=[r])[0]
                for r, (_, n, m) in REQUESTS.items()}
    last_scheduled = {}  # request id -> the last step that scheduled it
    num_loads = 0  # async loads started
    for step in range(1184):
        for req_id in [r for r, (arrival, _, _) in REQUESTS.items() if arrival == step]:
            scheduler.add_request(requests[req_id])
        output = scheduler.schedule()
        last_scheduled.update(dict.fromkeys(output.num_scheduled_tokens, step))
        loads = [r for r, q in requests.items() if q.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                 and r not in scheduler.finished_recving_kv_req_ids]  # started in this step
        failed = {r for n, r in enumerate(loads, num_loads + 1) if n == FAILED_LOAD}
        num_loads += len(loads)
        ids = list(output.num_scheduled_tokens)
        done = [[0] if requests[r].num_computed_tokens >= requests[r].num_tokens else [] for r in ids]
        scheduler.update_from_output(output, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=done,
            kv_connector_output=KVConnectorOutput(finished_recving=set(loads), failed_recving=failed)))
    stuck = {r: last_scheduled.get(r) for r, request in requests.items() if not request.is_finished()}
    assert not stuck, f"unfinished after 1184 steps (request: last step scheduled): {stuck}"
