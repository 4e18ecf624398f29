"""The chunk-split functions under test, all with the signature of vLLM's
`Scheduler._mamba_block_aligned_split(self, request, num_new_tokens,
num_new_local_computed_tokens=0, num_external_computed_tokens=0) -> int`.

- `fixed`: the installed vLLM's own method (nothing is replaced).
- `prefix`: the behaviour before the fix, written here from its description: a non-final
  chunk only had to end on a block boundary below `last_cache_position`, and a chunk starting
  mid-block only stopped at its block's boundary when that boundary was
  `<= last_cache_position`.
- `realign`: only the second of those two gates reverted.
- `module:function`: a user's candidate.

Like the method they replace, these read the scheduler's own attributes (`self`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from mambafuzz.sim.bridge.vllm_compat import VllmUnsupported
from mambafuzz.sim.bridge.vllm_compat.api import (
    get_mamba_prefill_checkpoint_position,
    is_mamba_prefill_checkpoint_valid,
)
from mambafuzz.sim.bridge.vllm_compat.resolve import Missing, describe_vllm

SplitFn = Callable[..., int]


class SplitError(ValueError):
    pass


# What the restatement reads: the split as vLLM 0.32 has it. A release whose scheduler lacks one
# has a different split, so the restatement (and prefix/realign) would not be a gate flip of it.
SCHEDULER_ATTRS = ("use_eagle_block_drop", "hash_block_size", "mamba_partial_cache_hit",
                   "mamba_has_prefill_checkpoint_blocks", "mamba_prefill_checkpoint_alignment",
                   "mamba_shared_prefix_checkpoint", "max_num_scheduled_tokens")


def _require_restatable(sched, request) -> None:
    missing = [a for a in SCHEDULER_ATTRS if not hasattr(sched, a)]
    if not hasattr(request, "shared_prefix_boundary"):
        missing.append("Request.shared_prefix_boundary")
    if missing:
        raise VllmUnsupported(f"the restated split (prefix, realign) needs vLLM's Scheduler.{', '.join(missing)}, "
                              f"which {describe_vllm(with_path=False)} lacks: its split is not the one restated here")


def gated_split(sched, request, num_new_tokens: int, local: int, external: int, *,
                align_only_below_cache_position: bool, realign_only_below_cache_position: bool) -> int:
    """Our own statement of the align-mode split rules, with the two pre-fix gates as flags."""
    _require_restatable(sched, request)
    block = sched.cache_config.block_size
    start = request.num_computed_tokens + local + external
    prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
    if start >= prefill_end:
        return num_new_tokens  # decode, or replaying output tokens past the prefill
    drop = sched.use_eagle_block_drop
    end = start + num_new_tokens

    # The furthest block boundary whose state the prefix cache may keep.
    cache_position = get_mamba_prefill_checkpoint_position(request.num_tokens, block, drop)
    # A backend that exports a checkpoint inside the final chunk needs no early stop.
    checkpoint_unit = sched.hash_block_size if sched.mamba_partial_cache_hit else block
    internal_checkpoint = (
        sched.mamba_has_prefill_checkpoint_blocks
        and end >= prefill_end
        and is_mamba_prefill_checkpoint_valid(
            query_start=start, query_end=end,
            checkpoint_position=get_mamba_prefill_checkpoint_position(prefill_end, checkpoint_unit, drop),
            hash_block_size=sched.hash_block_size, mamba_block_size=block,
            checkpoint_alignment=sched.mamba_prefill_checkpoint_alignment,
        )
    )
    if internal_checkpoint:
        cache_position = 0

    # Gate 1: state is stored only at chunk ends, so a chunk that is not the last must end
    # on a block boundary (unless one block is wider than any chunk can be).
    must_align = end < cache_position if align_only_below_cache_position else end < prefill_end
    if must_align:
        chunk_cap = sched.max_num_scheduled_tokens
        threshold = sched.scheduler_config.long_prefill_token_threshold
        if threshold > 0:
            chunk_cap = min(chunk_cap, threshold)
        floor_end = end - end % block
        if floor_end > start or block <= chunk_cap:
            end = floor_end

    # Gate 2: a chunk that starts mid-block stops at that block's boundary.
    boundary = start - start % block + block
    realign = start % block != 0 and not internal_checkpoint
    if realign_only_below_cache_position:
        realign = realign and boundary <= cache_position
    tail = 0
    if sched.mamba_partial_cache_hit and not internal_checkpoint:
        tail = get_mamba_prefill_checkpoint_position(request.num_prompt_tokens, sched.hash_block_size, drop)
    junction = request.shared_prefix_boundary
    if sched.mamba_shared_prefix_checkpoint and junction <= request.num_prompt_tokens:
        junction_stop = junction
    else:
        junction_stop = start + (junction - start) // block * block
    candidates = [
        boundary if realign else 0,
        cache_position,
        tail if cache_position < tail < request.num_prompt_tokens else 0,
        junction_stop if start < junction < end else 0,
    ]
    inside = [c for c in candidates if start < c < end]
    if inside:
        end = min(inside)
    return max(end - start, 0)


def prefix_split(self, request, num_new_tokens, num_new_local_computed_tokens=0, num_external_computed_tokens=0):
    return gated_split(self, request, num_new_tokens, num_new_local_computed_tokens, num_external_computed_tokens,
                       align_only_below_cache_position=True, realign_only_below_cache_position=True)


def realign_split(self, request, num_new_tokens, num_new_local_computed_tokens=0, num_external_computed_tokens=0):
    return gated_split(self, request, num_new_tokens, num_new_local_computed_tokens, num_external_computed_tokens,
                       align_only_below_cache_position=False, realign_only_below_cache_position=True)


def restated_fixed_split(self, request, num_new_tokens, num_new_local_computed_tokens=0, num_external_computed_tokens=0):
    """Our restatement with both gates fixed; tests hold it equal to the installed method,
    which is what makes `prefix` and `realign` differ from `fixed` in the gates alone."""
    return gated_split(self, request, num_new_tokens, num_new_local_computed_tokens, num_external_computed_tokens,
                       align_only_below_cache_position=False, realign_only_below_cache_position=False)


BUILTIN = {"fixed": None, "prefix": prefix_split, "realign": realign_split, "restated": restated_fixed_split}


def resolve(name: str) -> SplitFn | None:
    """Map a --split value to a function (None keeps the installed method)."""
    if name in BUILTIN:
        if BUILTIN[name] is not None and isinstance(get_mamba_prefill_checkpoint_position, Missing):
            # The restatement follows the split of vLLM >= 0.30, built on that function.
            raise VllmUnsupported(f"--split {name} cannot run: {get_mamba_prefill_checkpoint_position.why}")
        return BUILTIN[name]
    if ":" not in name:
        raise SplitError(f"unknown split {name!r}: use fixed, prefix, realign or package.module:function")
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise SplitError(f"cannot import split module {module_name!r}: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise SplitError(f"{module_name!r} has no callable {attr!r}")
    return fn
