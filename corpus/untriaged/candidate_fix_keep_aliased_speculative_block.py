"""Candidate fix (narrower variant of candidate_fix_reserve_every_worker_checkpoint.py).

Same root cause: on a non-final prefill chunk the worker exports an internal checkpoint into
column `cdiv(query_end, block_size) - 2` (layers/mamba/checkpoint.py:21-57), while
`MambaManager.allocate_new_blocks` relocates the speculative block sitting in that column to the
chunk-end column and nulls the old column without telling the worker
(v1/core/single_type_kv_cache_manager.py:1843-1855, :1908-1917). The worker's append-only table
(V2 gpu/model_runner.py:1234-1247, V1 gpu_model_runner.py:1417-1450) then sends the checkpoint
and the chunk-end state to the same physical block in one forward.

This variant keeps the `query_end >= prefill_end` gate of `_needs_internal_checkpoint` (:1643-1674)
and reserves a checkpoint block on a non-final chunk only when the checkpoint column holds a
speculative block the relocation loop would move, i.e. exactly when the stale worker column
would alias the chunk-end block. The block then stays in place and receives the checkpoint; a
fresh block takes the chunk end. One block more on those chunks only.
"""

from __future__ import annotations

from mambafuzz.sim.patching import Rewrite

OLD = """\
self.has_prefill_checkpoint_blocks
and query_end >= prefill_end
and is_mamba_prefill_checkpoint_valid(
"""

NEW = """\
self.has_prefill_checkpoint_blocks
and (
    query_end >= prefill_end
    # mambafuzz candidate fix: the worker exports this chunk's checkpoint
    # anyway; if its column holds the speculative block that
    # allocate_new_blocks would relocate to the chunk-end column, reserve
    # it so it stays in place.
    or (
        request_id in self._allocated_block_reqs
        and len(blocks) - self.num_speculative_blocks
        <= cdiv(query_end, self.block_size) - 2
        < len(blocks)
    )
)
and is_mamba_prefill_checkpoint_valid(
"""

PATCHES = [
    Rewrite(
        "vllm.v1.core.single_type_kv_cache_manager:MambaManager._needs_internal_checkpoint",
        ((OLD, NEW),),
    ),
]
