"""Candidate fix for parked_loads_promotion_mamba_blocks_stall: the in-flight reservation of a
parked async load counts the copy-on-write block its promotion will take in each mamba "align"
group.

Why (vLLM 0.32.0): when the load finishes, `_update_waiting_for_remote_kv` caches the loaded blocks
(`cache_blocks`, v1/core/sched/scheduler.py:3157); `MambaManager._cache_partial_tail_block` keys the
state at a sub-block prompt boundary and records the block for copy-on-write
(`_partial_hit_reqs`, v1/core/single_type_kv_cache_manager.py:2101-2103), so the request's next
allocation asks one more block per mamba group (`get_num_blocks_to_allocate`, :1733-1739). The
reservation other async admissions keep for it (`_request_remaining_blocks`, scheduler.py:3060-3078,
"Blocks `request` still needs to hold its full sequence and be promoted") is computed while it is
still parked, before that record exists, and so counts 0 for it.
"""
from mambafuzz.sim.patching import Rewrite

OLD = """\
        return self.kv_cache_manager.coordinator.get_num_blocks_to_allocate(
            request_id=request.request_id,
            num_tokens=num_tokens,
            new_computed_blocks=self.kv_cache_manager.empty_kv_cache_blocks.blocks,
            num_encoder_tokens=0,
            total_computed_tokens=request.num_computed_tokens,
            num_local_computed_tokens=request.num_computed_tokens,
            num_tokens_main_model=full_num_tokens,
            apply_admission_cap=True,
            prefill_end=max(request.num_prompt_tokens, request.num_tokens - 1),
        )
"""
NEW = """\
        num_blocks = self.kv_cache_manager.coordinator.get_num_blocks_to_allocate(
            request_id=request.request_id,
            num_tokens=num_tokens,
            new_computed_blocks=self.kv_cache_manager.empty_kv_cache_blocks.blocks,
            num_encoder_tokens=0,
            total_computed_tokens=request.num_computed_tokens,
            num_local_computed_tokens=request.num_computed_tokens,
            num_tokens_main_model=full_num_tokens,
            apply_admission_cap=True,
            prefill_end=max(request.num_prompt_tokens, request.num_tokens - 1),
        )
        if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:  # mambafuzz candidate fix
            # The promotion keys a sub-block tail state; its next forward copies it first.
            num_computed = request.num_computed_tokens
            for manager in self.kv_cache_manager.coordinator.single_type_managers:
                if (getattr(manager, "mamba_cache_mode", None) == "align"
                        and request.request_id not in manager._partial_hit_reqs
                        and num_computed % manager.block_size
                        and num_computed % manager.block_pool.hash_block_size == 0):
                    num_blocks += 1
        return num_blocks
"""
PATCHES = [Rewrite("vllm.v1.core.sched.scheduler:Scheduler._request_remaining_blocks", ((OLD, NEW),))]
