"""The bodies of `mambafuzz export-test --style vllm`: short tests meant to be dropped into vLLM's
own tree. The scheduler ones build the scheduler with vLLM's test helpers (`tests/v1/core/utils.py`:
`create_scheduler`, `create_requests`), carry vLLM's `cpu_test` marker and assert one invariant.
Kept as text, filled by mambafuzz/upstream/export.py; nothing in them may import mambafuzz."""

HEADER = """\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""

SCHEDULER_TEMPLATE = HEADER + r'''"""{title}

{why}Exported by mambafuzz from {case_name} ({signature}).
"""

import pytest

from vllm.v1.outputs import ModelRunnerOutput

from .utils import create_requests, create_scheduler

pytestmark = pytest.mark.cpu_test

NUM_SPECULATIVE_TOKENS = {num_spec}
LONG_PREFILL_TOKEN_THRESHOLD = {threshold}
# request id -> (arrival step, prompt length, max tokens)
REQUESTS = {requests!r}


def test_{test_name}():
    scheduler = create_scheduler(
        num_speculative_tokens=NUM_SPECULATIVE_TOKENS,
        long_prefill_token_threshold=LONG_PREFILL_TOKEN_THRESHOLD,
        max_num_batched_tokens={budget},
        max_num_seqs={max_num_seqs},
        max_model_len={max_model_len},
    )
    requests = {{}}
    for step in range({max_steps}):
        for req_id, (arrival, prompt_len, max_tokens) in REQUESTS.items():
            if arrival == step:
                (requests[req_id],) = create_requests(
                    1, prompt_len, max_tokens=max_tokens, req_ids=[req_id]
                )
                scheduler.add_request(requests[req_id])
        output = scheduler.schedule()
{check}
        ids = list(output.num_scheduled_tokens)
        done = [requests[i].num_computed_tokens >= requests[i].num_tokens for i in ids]
        scheduler.update_from_output(output, ModelRunnerOutput(
            req_ids=ids, {row_index}sampled_token_ids=[[0] if d else [] for d in done],
        ))
    assert not scheduler.has_unfinished_requests()
'''

CHECKS = {
    "no_crash": "        # reaching this line is the check: schedule() must not raise",
    "fresh_prompt_not_spec_row": """\
        for req_id in output.scheduled_spec_decode_tokens:
            computed = requests[req_id].num_computed_tokens
            assert computed > output.num_scheduled_tokens[req_id], (
                f"step {step}: {req_id} has no computed tokens but got placeholder drafts")""",
}

WHY = {
    "no_crash": "A padded speculative row clipped by long_prefill_token_threshold keeps its padding flag, and\n"
                "`assert num_new_tokens == 1 + self.num_spec_tokens` fires inside schedule().\n",
    "fresh_prompt_not_spec_row": "A fresh one-token prompt that arrives beside a running spec-decode request is padded with\n"
                                 "placeholder drafts. With nothing computed it has no Mamba state to roll back to: Model\n"
                                 "Runner V1 runs it through the GDN spec kernel from an unzeroed block, and V2 (and Mamba2)\n"
                                 "through a prefill kernel that keeps the rejected placeholder in the state.\n",
}

# Findings that need a mamba KV-cache group. create_scheduler builds one attention group (its
# kv_cache_spec argument replaces that group, it adds none), so the test hands it a
# `scheduler_cls` that appends the mamba group(s) and turns on align mode; the rest (configs,
# requests, the KV connector) is vLLM's helpers as they are.
HYBRID_HEAD = HEADER + r'''"""{title}

{why}Exported by mambafuzz from {case_name} ({signature}).
"""

import pytest
import torch

{pre_imports}from vllm.v1.core.sched.scheduler import Scheduler
{imports}
from .utils import create_requests, create_scheduler{extra_helpers}

pytestmark = pytest.mark.cpu_test

MAMBA_BLOCK_SIZE = {block_size}  # create_scheduler's attention block has the same size
HASH_BLOCK_SIZE = {hash_block_size}  # prefix_match_unit
{constants}

def hybrid_scheduler(vllm_config, kv_cache_config, **kwargs):  # {groups_doc}, align mode
    vllm_config.cache_config.mamba_cache_mode = "align"{config_extra}
    mamba = MambaSpec(block_size=MAMBA_BLOCK_SIZE, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align",
                      num_prefill_checkpoint_blocks={checkpoint_blocks}, prefill_checkpoint_alignment={alignment}{mamba_extra})
    kv_cache_config.kv_cache_groups += {groups_code}
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     hash_block_size=HASH_BLOCK_SIZE, **kwargs)
'''

HYBRID_SCHEDULER = r"""    scheduler = create_scheduler(block_size=MAMBA_BLOCK_SIZE, enable_prefix_caching=True,
                                 scheduler_cls=hybrid_scheduler, {kwargs})
"""

# The hashed slot's state: a mamba block hashed as a whole block holds the state after its last
# token. The kernels write a chunk's end and, for a Mamba2-style mixer, its internal checkpoint
# (vLLM's own rule for it); partial-tail entries are not checked.
SLOT_HASH_TEMPLATE = HYBRID_HEAD + r"""

def test_{test_name}():
""" + HYBRID_SCHEDULER + r"""    mamba = scheduler.kv_cache_manager.coordinator.single_type_managers[1]
    requests = {{r: create_requests(1, n, max_tokens=m, block_size=HASH_BLOCK_SIZE, req_ids=[r])[0]
                for r, (_, n, m) in REQUESTS.items()}}
    state_at = {{}}  # mamba block id -> offset of the state written there
    for step in range({max_steps}):
        for req_id in [r for r, (arrival, _, _) in REQUESTS.items() if arrival == step]:
            scheduler.add_request(requests[req_id])
        output = scheduler.schedule()
        for req_id, n in output.num_scheduled_tokens.items():  # where the kernels write states
            blocks, end = mamba.req_to_blocks[req_id], requests[req_id].num_computed_tokens
            state_at[blocks[(end - 1) // MAMBA_BLOCK_SIZE].block_id] = end  # the chunk's end
            ckpt = get_mamba_prefill_checkpoint_position(end, HASH_BLOCK_SIZE, False)
            if is_mamba_prefill_checkpoint_valid(end - n, end, ckpt, HASH_BLOCK_SIZE, MAMBA_BLOCK_SIZE, {alignment}):
                state_at[blocks[(end - 1) // MAMBA_BLOCK_SIZE - 1].block_id] = ckpt  # checkpoint
        for req_id, blocks in mamba.req_to_blocks.items():
            for slot, block in enumerate(blocks):
                boundary = (slot + 1) * MAMBA_BLOCK_SIZE  # what a whole block's hash claims
                if block.block_hash is not None and block.block_hash_num_tokens in (None, boundary):
                    assert state_at.get(block.block_id) == boundary, (
                        f"step {{step}}: {{req_id}}'s mamba slot {{slot}} is hashed as state@{{boundary}}")
        ids = list(output.num_scheduled_tokens)
        done = [[0] if requests[r].num_computed_tokens >= requests[r].num_tokens else [] for r in ids]
        scheduler.update_from_output(output, ModelRunnerOutput(
            req_ids=ids, {row_index}sampled_token_ids=done))
"""

# The admitted blocks: a request the pool cannot hold yet must wait; schedule() must not raise.
# One call: vLLM's mock_kv connector is no SupportsHMA connector, and a request that finishes
# with it under a hybrid KV cache trips request_finished's single-group assert.
ADMISSION_TEMPLATE = HYBRID_HEAD + r"""

def test_{test_name}():
""" + HYBRID_SCHEDULER + r"""    # {num_requests} distinct {prompt_len}-token prompts; the connector reports {external} tokens for each
    for request in create_requests({num_requests}, {prompt_len}, block_size=HASH_BLOCK_SIZE):
        scheduler.add_request(request)
    # before the fix: "ValueError: Cannot get N free blocks from the pool"
    scheduler.schedule()
"""

WHY["published_state_written"] = (
    "A prefill resuming mid-block under an internal checkpoint (Mamba2) crosses a block boundary in one\n"
    "chunk: the kernels write its end and the checkpoint, yet the resume slot is hashed as the boundary.\n")
WHY["no_crash_admission"] = (
    "With KV-connector tokens the align-mode admission estimate is capped at physical_block_cap, but\n"
    "allocate_external_computed_blocks takes one more block per mamba group outside the cap: near a\n"
    "full pool BlockPool.get_new_blocks raises inside schedule() instead of the request waiting.\n")

HYBRID_IMPORTS = "from vllm.v1.kv_cache_interface import KVCacheGroupSpec, MambaSpec\n"
SLOT_HASH_IMPORTS = """from vllm.v1.kv_cache_interface import (KVCacheGroupSpec, MambaSpec,
    get_mamba_prefill_checkpoint_position, is_mamba_prefill_checkpoint_valid)
from vllm.v1.outputs import ModelRunnerOutput
"""

# Liveness: every request finishes within the step bound the fuzzer's harness gave the case (one
# step per token, plus arrivals); the assertion names each request left unfinished and the last
# step that scheduled it. A case with KV-connector tokens gets `ScenarioKV` (STALL_CONNECTOR):
# vLLM's mock connector with each request's own hit, finishing under a hybrid KV cache (SupportsHMA),
# and the test plays the worker: each async load ends in the step that starts it, and the
# FAILED_LOAD-th fails (`failed_recving`, the channel vLLM 0.32 gives a hybrid KV cache).
STALL_TEMPLATE = HYBRID_HEAD + r"""

def test_{test_name}():
""" + HYBRID_SCHEDULER + r"""    requests = {{r: create_requests(1, n, max_tokens=m, block_size=HASH_BLOCK_SIZE, req_ids=[r])[0]
                for r, (_, n, m) in REQUESTS.items()}}
    last_scheduled = {{}}  # request id -> the last step that scheduled it{loads_init}
    for step in range({max_steps}):
        for req_id in [r for r, (arrival, _, _) in REQUESTS.items() if arrival == step]:
            scheduler.add_request(requests[req_id])
        output = scheduler.schedule()
        last_scheduled.update(dict.fromkeys(output.num_scheduled_tokens, step))
{worker}        ids = list(output.num_scheduled_tokens)
        done = [[0] if requests[r].num_computed_tokens >= requests[r].num_tokens else [] for r in ids]
        scheduler.update_from_output(output, ModelRunnerOutput(
            req_ids=ids, {row_index}sampled_token_ids=done{kv_output}))
    stuck = {{r: last_scheduled.get(r) for r, request in requests.items() if not request.is_finished()}}
    assert not stuck, f"unfinished after {max_steps} steps (request: last step scheduled): {{stuck}}"
"""

STALL_CONNECTOR = r'''

class ScenarioKV(MockKVConnector, SupportsHMA):
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        tokens, is_async = EXTERNAL.get(request.request_id, (0, False))  # never the whole prompt
        new = max(0, min(tokens, request.num_prompt_tokens - 1) - num_computed_tokens)
        return new, is_async and new > 0

    def request_finished_all_groups(self, request, block_ids):
        return False, None
'''
STALL_CONNECTOR_CONFIG = '''
    kv = vllm_config.kv_transfer_config
    kv.kv_connector, kv.kv_connector_module_path = "ScenarioKV", __name__
    kv.kv_load_failure_policy = "{policy}"'''
STALL_WORKER = r"""        loads = [r for r, q in requests.items() if q.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                 and r not in scheduler.finished_recving_kv_req_ids]  # started in this step
        failed = {r for n, r in enumerate(loads, num_loads + 1) if n == FAILED_LOAD}
        num_loads += len(loads)
"""
STALL_KV_OUTPUT = ",\n            kv_connector_output=KVConnectorOutput(finished_recving=set(loads), failed_recving=failed)"
STALL_PRE_IMPORTS = """from tests.v1.kv_connector.unit.utils import MockKVConnector
from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
"""
STALL_IMPORTS = """from vllm.v1.kv_cache_interface import KVCacheGroupSpec, MambaSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import RequestStatus
"""

WHY["every_request_finishes"] = (
    "Every request must finish within the step bound (one step per token, plus arrivals); a request\n"
    "the scheduler stops scheduling is named with the last step that scheduled it.\n")
