"""Candidate fix: the align-mode admission estimate of `MambaManager` also counts the blocks
`allocate_external_computed_blocks` takes for sync connector tokens.

Why: `get_num_blocks_to_allocate` caps its count at `physical_block_cap`, but the external
allocation runs before `allocate_new_blocks` and outside that cap, one block per mamba group;
near a full pool `get_new_blocks` then raises inside `schedule()` instead of the request
waiting. The wrap counts what the external allocation and then `allocate_new_blocks` will
really take (the same arithmetic as both), and never returns less than vLLM's estimate.
"""

from __future__ import annotations

from vllm.utils.math_utils import cdiv

from mambafuzz.sim.patching import Wrap

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
        # What the two allocations will really take, in their order: the external one fills the
        # table up to the computed tokens; allocate_new_blocks then adds only what is still
        # missing (the two overlap, so they are not added up), plus a CoW block on a partial hit.
        have = len(self.req_to_blocks.get(request_id, ())) + len(new_computed_blocks)
        taken_external = max(0, cdiv(total_computed_tokens, self.block_size) - have)
        required = cdiv(num_tokens_main_model, self.block_size) + self.num_speculative_blocks
        partial_hit = (self._has_partial_local_hit(new_computed_blocks, num_local_computed_tokens)
                       or request_id in self._partial_hit_reqs)
        taken_new = max(required - have - taken_external, 0) + int(partial_hit)
        evictable = self._get_num_evictable_blocks(new_computed_blocks)
        return max(n, taken_external + taken_new + evictable)
    return get_num_blocks_to_allocate


PATCHES = [Wrap(TARGET, _count_external_state_blocks)]
