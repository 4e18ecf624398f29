"""Candidate fix: a prefill chunk that starts mid-block stops at its own block's boundary
even when the engine exports internal prefill checkpoints.

Why: `_mamba_block_aligned_split` drops the mid-block stop when `use_internal_checkpoint`,
but the kernels write only the chunk-end state and the checkpoint; the resume block is then
published as the boundary state it never held. The wrap only shortens such chunks, so it
composes with any split under test (vLLM's own, a mutant, a `--split` candidate).
"""

from __future__ import annotations

from fuzz.patching import SPLIT_TARGET, Wrap


def _stop_at_own_boundary(split):
    def fixed_split(self, request, num_new_tokens, num_new_local_computed_tokens=0,
                    num_external_computed_tokens=0):
        n = split(self, request, num_new_tokens, num_new_local_computed_tokens, num_external_computed_tokens)
        if n <= 0 or not self.mamba_has_prefill_checkpoint_blocks:
            return n
        block = self.cache_config.block_size
        start = request.num_computed_tokens + num_new_local_computed_tokens + num_external_computed_tokens
        if start % block == 0 or start >= max(request.num_prompt_tokens, request.num_tokens - 1):
            return n
        return min(n, block - start % block)
    return fixed_split


PATCHES = [Wrap(SPLIT_TARGET, _stop_at_own_boundary)]
