# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Model Runner V1: a padded prompt tail behind a short extend runs Mamba2's prefill path.

From v1_mamba2_padded_remote_tail_behind_short_extend.json (conform:writes/mamba2@v1), written
by hand. Fails on unmodified vLLM 0.32.0; passes with
candidate_fix_padded_tail_decode_first.py applied:

    MAMBAFUZZ_PATCHES=corpus/untriaged/candidate_fix_padded_tail_decode_first.py \
      python -m pytest -p mambafuzz.upstream.fix_plugin -o addopts= THIS_FILE

MTP k=1, 8-token mamba blocks, align mode. One step of the V1 runner, driven through vLLM's
own code on CPU the way GPUModelRunner drives it:
- r0: a prompt chunk of 2 tokens after 20 computed (prompt 23): a short extend;
- r1: 35 of 36 prompt tokens loaded by a KV connector; the scheduler padded its last prompt
  token with one placeholder draft (scheduler.py, `pad_spec_decode`), so 2 tokens, 1 draft.
The persistent batch holds them in that order (r0 was admitted first). `_update_states`
reorders it (reorder_batch_to_split_decodes_and_prefills), `_prepare_inputs` tags r1 with
`num_decode_draft_tokens == 1`, and the Mamba2 builder must then run r1 as a speculative
decode (mamba_attn.py: "The prefill kernels only return h(N+K) and cannot roll the
placeholders back").

The builder is vLLM's real Mamba2AttentionMetadataBuilder; only its VllmConfig is a stand-in
carrying the fields the builder reads (no model is loaded).
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends import utils as backend_utils
from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

pytestmark = pytest.mark.cpu_test

CPU = torch.device("cpu")
BLOCK_SIZE = 8
K = 1  # num_speculative_tokens
MAX_MODEL_LEN = 64
# req id -> (prompt length, computed tokens, scheduled tokens, drafts, block ids); batch order
REQUESTS = {
    "r0": (23, 20, 2, 0, [1, 2, 21, 22]),
    "r1": (36, 35, 2, 1, [1, 2, 3, 4, 65, 71]),  # the padded prompt tail
}
PADDED_TAIL = "r1"


def stand_in_config():
    """The VllmConfig fields BaseMambaAttentionMetadataBuilder / Mamba2's builder read."""
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K, parallel_drafting=False),
        use_v2_model_runner=False,
        num_speculative_tokens=K,
        compilation_config=SimpleNamespace(
            max_cudagraph_capture_size=None,
            cudagraph_mode=SimpleNamespace(has_full_cudagraphs=lambda: False),
        ),
        cache_config=SimpleNamespace(
            use_replayssm=False, replayssm_buffer_len=0, mamba_cache_mode="align",
        ),
        mamba_config=SimpleNamespace(backend=None),
        scheduler_config=SimpleNamespace(max_num_seqs=4, async_scheduling=True),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        model_config=SimpleNamespace(get_mamba_chunk_size=lambda: 256),
    )


def test_v1_mamba2_padded_tail_behind_short_extend_runs_as_spec_decode():
    spec = MambaSpec(
        block_size=BLOCK_SIZE, shapes=((1,),), dtypes=(torch.float32,),
        mamba_type=MambaAttentionBackendEnum.MAMBA2, mamba_cache_mode="align",
        num_speculative_blocks=K,
    )
    builder = Mamba2AttentionMetadataBuilder(spec, ["mamba"], stand_in_config(), CPU)
    assert builder.reorder_batch_threshold == 1 + K

    batch = InputBatch(
        max_num_reqs=4, max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=16,
        device=CPU, vocab_size=1024, block_sizes=[BLOCK_SIZE],
        max_num_blocks_per_req=[MAX_MODEL_LEN // BLOCK_SIZE + K + 2],
        num_spec_tokens=K,
    )
    for req_id, (prompt, computed, _, _, blocks) in REQUESTS.items():
        batch.add_request(CachedRequestState(
            req_id=req_id, prompt_token_ids=[0] * prompt, mm_features=[],
            sampling_params=SamplingParams(temperature=0.0, max_tokens=1),
            generator=None, block_ids=(list(blocks),), num_computed_tokens=computed,
            output_token_ids=[],
        ))
    batch.condense()
    scheduler_output = SimpleNamespace(
        num_scheduled_tokens={r: v[2] for r, v in REQUESTS.items()},
        scheduled_spec_decode_tokens={r: [-1] * v[3] for r, v in REQUESTS.items() if v[3]},
    )
    # GPUModelRunner._may_reorder_batch, with the builders' threshold (1 + K)
    backend_utils.reorder_batch_to_split_decodes_and_prefills(
        batch, scheduler_output, decode_threshold=builder.reorder_batch_threshold)
    batch.refresh_metadata()

    n = batch.num_reqs
    order = list(batch.req_ids[:n])
    batch.block_table.commit_block_table(n)
    query = torch.tensor([REQUESTS[r][2] for r in order], dtype=torch.int32)
    qsl = torch.zeros(n + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query, 0)
    seq_lens = torch.tensor([REQUESTS[r][1] + REQUESTS[r][2] for r in order], dtype=torch.int32)
    # _build_attention_metadata: is_prefilling = num_computed < num_prompt
    is_prefilling = (batch.num_computed_tokens_cpu_tensor[:n]
                     < batch.num_prompt_tokens_cpu_tensor[:n])
    # _prepare_inputs: num_decode_draft_tokens is the draft count where scheduled == drafts + 1
    drafts = np.full(n, -1, dtype=np.int32)
    for i, r in enumerate(order):
        num_drafts = len(scheduler_output.scheduled_spec_decode_tokens.get(r, ()))
        if num_drafts and REQUESTS[r][2] == num_drafts + 1:
            drafts[i] = num_drafts
    common = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens,
        seq_lens_cpu_upper_bound=seq_lens.clone(), num_reqs=n,
        num_actual_tokens=int(qsl[-1]), max_query_len=int(query.max()),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=batch.block_table[0].get_device_tensor(n),
        slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64), causal=True,
        is_prefilling=is_prefilling.clone(),
    )
    md = builder.build(
        0, common, num_accepted_tokens=torch.ones(n, dtype=torch.int32),
        num_decode_draft_tokens_cpu=torch.from_numpy(drafts),
    )

    row = order.index(PADDED_TAIL)
    assert row < md.num_decodes, (
        f"batch order {order}, num_decodes={md.num_decodes}: the padded prompt tail "
        f"{PADDED_TAIL} (row {row}, {int(drafts[row])} placeholder draft) runs Mamba2's prefill "
        f"path, which writes only the state after the placeholder into its running block "
        f"({int(md.state_indices_tensor_p[row - md.num_decodes])}) and cannot roll it back")
    # as a spec decode it writes the state after each token into its own column
    assert md.state_indices_tensor_d[row].tolist() == REQUESTS[PADDED_TAIL][4][4:6]
