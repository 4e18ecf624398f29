"""Candidate fix: reserve a Mamba prefill-checkpoint block for every chunk the worker exports one in.

Why: the worker exports an internal prefill checkpoint for *every* prefill chunk where
`is_mamba_prefill_checkpoint_valid` holds (layers/mamba/checkpoint.py:21-57,
`compute_mamba_prefill_checkpoints`, called by `MambaPrefillCheckpointBuilder.build`:98-156 from
the Mamba2 builder, v1/attention/backends/mamba2_attn.py:180-187), into block-table column
`cdiv(query_end, block_size) - 2` of the table the worker built from SchedulerOutput. Under the
default `prefix_cache_retention_interval=0`, `MambaManager._needs_internal_checkpoint`
(v1/core/single_type_kv_cache_manager.py:1643-1674) reserves that column only for the chunk that
ends the prefill (`query_end >= prefill_end`; the coordinator passes `prefill_end=0`, i.e. every
chunk, for any other retention, kv_cache_coordinator.py:233-234). On a non-final chunk that
advances the running column by exactly two, `allocate_new_blocks` then relocates the
speculative block from the checkpoint column to the chunk-end column and nulls the old column
without telling the worker (`_relocate_speculative_block`, :1843-1855, :1908-1917); the worker's
append-only table keeps the block at the old column too, so the checkpoint and the chunk-end
state go to the same physical block in one forward. In Mamba2's forward the final conv state
is written by `causal_conv1d_fn` before `store_prefill_checkpoint` and the final SSM state after
it (layers/mamba/mamba_mixer2.py:822-897), so the block keeps the checkpoint's conv state and
the chunk end's SSM state: the running state the next chunk copies and continues from is wrong.

The fix: drop the `query_end >= prefill_end` gate, so the manager reserves (and keeps in place:
the relocation loop stops at the checkpoint index, :1846-1855) a block for every checkpoint the
worker writes, as it already does under any retention other than 0. The non-final checkpoint
is re-keyed at its exact boundary when retained, and evicted as transient otherwise
(`_cache_partial_tail_block`, :2018-2067). Cost: one more block per such chunk, within the
start-up reserve (`2 + speculative + checkpoint` per mamba group).
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
# mambafuzz candidate fix: the worker exports a checkpoint on every chunk
# where it is valid (compute_mamba_prefill_checkpoints), so reserve one
# on every such chunk, not only on the chunk that ends the prefill.
and is_mamba_prefill_checkpoint_valid(
"""

PATCHES = [
    Rewrite(
        "vllm.v1.core.single_type_kv_cache_manager:MambaManager._needs_internal_checkpoint",
        ((OLD, NEW),),
    ),
]
