"""The bodies of `mambafuzz export-test --style vllm`: short tests meant to be dropped into vLLM's
own tree. The scheduler ones build the scheduler with vLLM's test helpers (`tests/v1/core/utils.py`:
`create_scheduler`, `create_requests`), carry vLLM's `cpu_test` marker and assert one invariant.
Kept as text, filled by fuzz/store/export.py; nothing in them may import mambafuzz."""

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
            req_ids=ids,
            req_id_to_index={{req_id: n for n, req_id in enumerate(ids)}},
            sampled_token_ids=[[0] if d else [] for d in done],
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
