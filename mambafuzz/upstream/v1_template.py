"""The body of an exported test for a Model Runner V1 worker finding (`mambafuzz export-test`):
a standalone pytest that drives vLLM's own V1 persistent batch (`InputBatch`) the way
`GPUModelRunner._update_states` does. Kept as text, filled by mambafuzz/upstream/export.py; nothing in it may
import mambafuzz, so it can be pasted into vLLM's tree."""

V1_ACCEPTED_TEMPLATE = r'''"""{title}

Exported by mambafuzz from {case_name} (signature {signature}).
Fails on the unmodified vLLM; passes with the candidate fix applied.
{why}
Model Runner V1 only. Driven through vLLM's real V1 persistent batch
(vllm/v1/worker/gpu_input_batch.py) the way GPUModelRunner._update_states drives it
(gpu_model_runner.py): a request not scheduled for a step is removed from the batch, and added
back when it is scheduled again. Its accepted-token count must survive that, because the mamba
state column (`mamba_state_idx`) survives it: the next spec-decode row reads the state
`num_accepted - 1` tokens into that column.
"""

import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

MAMBA_BLOCK_SIZE = {block_size}
NUM_SPECULATIVE_TOKENS = {num_spec}
MAX_MODEL_LEN = {max_model_len}
PROMPT_LENS = {prompt_lens!r}  # request id -> prompt length
SKIPPING = {skipping!r}  # the request that sits out a step
KEPT = 1 + NUM_SPECULATIVE_TOKENS  # its last spec row kept its drafts without crossing a block


def make_batch():
    return InputBatch(max_num_reqs=len(PROMPT_LENS), max_model_len=MAX_MODEL_LEN,
                      max_num_batched_tokens=MAX_MODEL_LEN, device=torch.device("cpu"), vocab_size=1024,
                      block_sizes=[MAMBA_BLOCK_SIZE],
                      max_num_blocks_per_req=[MAX_MODEL_LEN // MAMBA_BLOCK_SIZE + NUM_SPECULATIVE_TOKENS + 2],
                      num_spec_tokens=NUM_SPECULATIVE_TOKENS)


def request_state(req_id):
    return CachedRequestState(req_id=req_id, prompt_token_ids=[0] * PROMPT_LENS[req_id], mm_features=[],
                              sampling_params=SamplingParams(temperature=0.0, max_tokens=1), generator=None,
                              block_ids=([0],), num_computed_tokens=PROMPT_LENS[req_id], output_token_ids=[])


def update_states(batch, scheduled, states):
    """The persistent-batch part of GPUModelRunner._update_states for one step."""
    for req_id in set(batch.req_id_to_index) - set(scheduled):
        batch.remove_request(req_id)  # not scheduled this step
    for req_id in scheduled:
        if req_id not in batch.req_id_to_index:
            batch.add_request(states[req_id])  # new, or back after a step it sat out
    batch.condense()
    batch.refresh_metadata()


def test_{test_name}():
    states = {{req_id: request_state(req_id) for req_id in PROMPT_LENS}}
    others = [req_id for req_id in PROMPT_LENS if req_id != SKIPPING]
    batch = make_batch()
    update_states(batch, list(PROMPT_LENS), states)
    # postprocess_mamba (mamba_utils.py) keeps the count of a row that crossed no block
    batch.num_accepted_tokens_cpu[batch.req_id_to_index[SKIPPING]] = KEPT
    update_states(batch, others, states)  # the token budget goes to the others: SKIPPING sits out
    update_states(batch, list(PROMPT_LENS), states)  # SKIPPING is scheduled again
    got = int(batch.num_accepted_tokens_cpu[batch.req_id_to_index[SKIPPING]])
    assert got == KEPT, (
        f"{{SKIPPING}} kept {{KEPT}} tokens in its last spec row, sat out one step and came back with an "
        f"accepted-token count of {{got}}: its mamba state column still holds the state {{KEPT - 1}} token(s) in, "
        f"so the spec-decode kernel would read a state {{KEPT - got}} token(s) short")
'''
