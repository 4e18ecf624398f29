"""Candidate fix: Model Runner V1's reorder puts a padded prompt tail in the decode region.

Why: the scheduler pads a one-token prompt tail (a connector loaded every prompt token but the
last) with placeholder drafts to 1 + num_spec rows (scheduler.py:1131-1153, :1371-1375), and
`BaseMambaAttentionMetadataBuilder._compute_common_metadata` clears such a row's `is_prefilling`
so it runs the speculative decode path (mamba_attn.py:430-450). But
`reorder_batch_to_split_decodes_and_prefills` (attention/backends/utils.py:905-950) files the row
by `num_computed < num_prompt` as a short extend, in the same region as another request's prompt
chunk of at most k+1 tokens. When that chunk sits ahead of it, `split_decodes_and_prefills(...,
treat_short_extends_as_decodes=False)` (utils.py:862-871) ends the decode prefix at that chunk,
and the Mamba2 (and Mamba1) builder runs the padded tail as a prefill: the prefill kernels write
only the state after the placeholder into the running block (mamba_mixer2.py:897), which the
builder's own comment says cannot be rolled back. GDN picks spec rows by mask (gdn_attn.py:289-293)
and Model Runner V2 sorts drafted rows first (gpu/model_runner.py:2435-2447), so only V1 + a
positional (Mamba1/Mamba2) builder is affected.

The fix: a row with context, at most `decode_threshold` tokens, and exactly 1 + num_drafts
scheduled tokens with num_drafts > 0 (the rows `_prepare_inputs` gives `num_decode_draft_tokens
>= 0`, gpu_model_runner.py:2201-2210) goes to the decode region, as V2 does. Attention backends
already count short extends as decodes (treat_short_extends_as_decodes=True by default), so
moving the row ahead of them changes nothing for them.

A source edit of the installed function, applied to each module that bound it by name: vLLM's
definition, the V1 model runner (gpu_model_runner.py:141), and, when it is already imported (as
`mambafuzz conform` imports it before it loads --patch files), the conformance tier's V1 worker
(mambafuzz/conform/v1.py binds the name at import; imported later, it binds the patched one).
Importing mambafuzz.conform.v1 here would need Triton's CPU shim, so it is not forced.
"""

from __future__ import annotations

import sys

from mambafuzz.sim.patching import Rewrite

OLD = """\
is_short_extend = has_context & is_below_threshold & ~done_prefilling
is_decode = has_context & is_below_threshold & done_prefilling
"""

NEW = """\
# mambafuzz candidate fix: a prompt tail padded with placeholder drafts
# (num_scheduled == 1 + num_drafts) is a speculative decode transaction
# (mamba_attn.py padded_prompt_tail_rows); keep it in the decode region,
# ahead of short extends, as Model Runner V2's sort_batch_req_ids does.
num_drafts_np = np.array(
    [
        len(scheduler_output.scheduled_spec_decode_tokens.get(id, ()))
        for id in input_batch.req_ids
    ]
)
is_padded_tail = (num_drafts_np > 0) & (
    num_scheduled_tokens_np == num_drafts_np + 1
)
done_prefilling = done_prefilling | is_padded_tail
is_short_extend = has_context & is_below_threshold & ~done_prefilling
is_decode = has_context & is_below_threshold & done_prefilling
"""

EDITS = ((OLD, NEW),)
FUNCTION = "reorder_batch_to_split_decodes_and_prefills"

PATCHES = [
    Rewrite(f"vllm.v1.attention.backends.utils:{FUNCTION}", EDITS),
    Rewrite(f"vllm.v1.worker.gpu_model_runner:{FUNCTION}", EDITS),
]
if "mambafuzz.conform.v1" in sys.modules:
    PATCHES.append(Rewrite(f"mambafuzz.conform.v1:{FUNCTION}", EDITS))
