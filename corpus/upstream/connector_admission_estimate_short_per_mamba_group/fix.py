"""Candidate fix: the align-mode admission estimate of `MambaManager` also counts the blocks
`allocate_external_computed_blocks` takes for sync connector tokens.

Why: `get_num_blocks_to_allocate` caps its count at `physical_block_cap`, but the external
allocation runs before `allocate_new_blocks` and outside that cap, one block per mamba group;
near a full pool `get_new_blocks` then raises inside `schedule()` instead of the request
waiting. The wrap adds exactly what the external allocation will take (the same arithmetic
as `allocate_external_computed_blocks`), so it can only make admission more cautious.
"""

from __future__ import annotations

from vllm.utils.math_utils import cdiv

from fuzz.sim.patching import Wrap

TARGET = "vllm.v1.core.single_type_kv_cache_manager:MambaManager.get_num_blocks_to_allocate"


def _count_external_state_blocks(estimate):
    def get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks, total_computed_tokens,
                                   num_local_computed_tokens, num_tokens_main_model, *args, **kwargs):
        n = estimate(self, request_id, num_tokens, new_computed_blocks, total_computed_tokens,
                     num_local_computed_tokens, num_tokens_main_model, *args, **kwargs)
        external = total_computed_tokens - num_local_computed_tokens
        if self.mamba_cache_mode != "align" or external <= 0 or n > self.block_pool.num_gpu_blocks:
            return n
        skipped = self.get_num_skipped_tokens(total_computed_tokens)
        if skipped > 0:
            external = min(total_computed_tokens - skipped, external)
        if external <= 0:
            return n
        have = len(self.req_to_blocks.get(request_id, ())) + len(new_computed_blocks)
        return n + max(0, cdiv(total_computed_tokens, self.block_size) - have)
    return get_num_blocks_to_allocate


PATCHES = [Wrap(TARGET, _count_external_state_blocks)]
