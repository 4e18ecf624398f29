"""Candidate fix: when the split grants the internal-checkpoint exemption to a chunk that
starts mid-block, keep the stop at that block's boundary.

Why: `_mamba_block_aligned_split` drops the mid-block stop when `use_internal_checkpoint`,
but the kernels write only the chunk-end state and the checkpoint; the resume block is then
published as the boundary state it never held. The wrap acts only where vLLM's exemption
applies (`is_mamba_prefill_checkpoint_valid` on the unclipped chunk that reaches
`prefill_end`), so a different bug that makes a mid-block chunk cross a boundary is not
masked by it, and it composes with any split under test (vLLM's own, a mutant, a candidate).
"""

from __future__ import annotations

from vllm.v1.kv_cache_interface import get_mamba_prefill_checkpoint_position, is_mamba_prefill_checkpoint_valid

from mambafuzz.sim.patching import SPLIT_TARGET, Wrap


def exemption_granted(sched, request, start: int, end: int) -> bool:
    """Does vLLM's split exempt the chunk start..end from its mid-block stop?"""
    prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
    if not sched.mamba_has_prefill_checkpoint_blocks or end < prefill_end:
        return False
    block = sched.cache_config.block_size
    unit = sched.hash_block_size if sched.mamba_partial_cache_hit else block
    return is_mamba_prefill_checkpoint_valid(
        query_start=start, query_end=end,
        checkpoint_position=get_mamba_prefill_checkpoint_position(prefill_end, unit, sched.use_eagle_block_drop),
        hash_block_size=sched.hash_block_size, mamba_block_size=block,
        checkpoint_alignment=sched.mamba_prefill_checkpoint_alignment,
    )


def _stop_at_own_boundary(split):
    def fixed_split(self, request, num_new_tokens, num_new_local_computed_tokens=0,
                    num_external_computed_tokens=0):
        n = split(self, request, num_new_tokens, num_new_local_computed_tokens, num_external_computed_tokens)
        block = self.cache_config.block_size
        start = request.num_computed_tokens + num_new_local_computed_tokens + num_external_computed_tokens
        if n <= 0 or start % block == 0 or not exemption_granted(self, request, start, start + num_new_tokens):
            return n
        return min(n, block - start % block)
    return fixed_split


PATCHES = [Wrap(SPLIT_TARGET, _stop_at_own_boundary)]
