"""Candidate fix for partial_hit_admission_stall_min_pool: a prefix-cache hit with which the whole
sequence could never be admitted, even on an idle engine (its admission estimate exceeds every
usable block of the pool), is not taken; the request is admitted without it and recomputes the
prefix, as it would with prefix caching off. Side effect: a hit on a block cached in the same step
(whose estimate is the deferral sentinel, num_gpu_blocks + 1) is dropped instead of deferred."""
from mambafuzz.sim.patching import Rewrite

OLD = """\
        blocks = self.create_kv_cache_blocks(computed_blocks)
        return blocks, num_new_computed_tokens, shared_prefix_boundary
"""
NEW = """\
        if num_new_computed_tokens > 0:  # mambafuzz candidate fix
            full = min(request.num_tokens, self.max_model_len)
            need = self.coordinator.get_num_blocks_to_allocate(
                request_id=request.request_id, num_tokens=full, new_computed_blocks=computed_blocks,
                num_encoder_tokens=0, total_computed_tokens=num_new_computed_tokens,
                num_local_computed_tokens=num_new_computed_tokens, num_tokens_main_model=full,
                apply_admission_cap=True, prefill_end=max(request.num_prompt_tokens, request.num_tokens - 1))
            if need > self.block_pool.num_gpu_blocks - 1:
                return self.empty_kv_cache_blocks, 0, 0
        blocks = self.create_kv_cache_blocks(computed_blocks)
        return blocks, num_new_computed_tokens, shared_prefix_boundary
"""
# The same rule on the lookup a scheduler with a divergent-hit connector uses instead
# (`Scheduler._get_local_prefix_cache_hit` -> `get_computed_blocks_for_connector`, whose convergent
# hit returns here without calling `get_computed_blocks`).
OLD_CONNECTOR = """\
        num_local = per_group_hits[fa_group_id]
        blocks = self.create_kv_cache_blocks(computed)
"""
NEW_CONNECTOR = """\
        num_local = per_group_hits[fa_group_id]
        if num_local > 0:  # mambafuzz candidate fix
            full = min(request.num_tokens, self.max_model_len)
            need = self.coordinator.get_num_blocks_to_allocate(
                request_id=request.request_id, num_tokens=full, new_computed_blocks=computed,
                num_encoder_tokens=0, total_computed_tokens=num_local,
                num_local_computed_tokens=num_local, num_tokens_main_model=full,
                apply_admission_cap=True, prefill_end=max(request.num_prompt_tokens, request.num_tokens - 1))
            if need > self.block_pool.num_gpu_blocks - 1:
                return self.empty_kv_cache_blocks, 0, 0, False
        blocks = self.create_kv_cache_blocks(computed)
"""
PATCHES = [Rewrite("vllm.v1.core.kv_cache_manager:KVCacheManager.get_computed_blocks", ((OLD, NEW),)),
           Rewrite("vllm.v1.core.kv_cache_manager:KVCacheManager.get_computed_blocks_for_connector",
                   ((OLD_CONNECTOR, NEW_CONNECTOR),))]
