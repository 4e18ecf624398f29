"""Planted bugs for mutation testing: small, plausible mistakes in vLLM's scheduling and
KV-cache functions, applied by monkeypatching the installed vLLM in this process only.

`MAMBAFUZZ_MUTANT=<name>` in the environment applies one when `fuzz.vllm_bridge` is imported,
so the fuzzer's worker processes run against the mutant; `bench/mutation_score.py` measures
which mutants the fuzzer kills from an empty corpus on `--split fixed`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from vllm.v1.core import single_type_kv_cache_manager as stkm
from vllm.v1.core.sched import scheduler as sched_mod

from fuzz import splits

MUTANTS: dict[str, tuple[str, Callable[[], None]]] = {}


def mutant(description: str):
    def register(fn: Callable[[], None]) -> Callable[[], None]:
        MUTANTS[fn.__name__] = (description, fn)
        return fn
    return register


def _patch_split(**mutation) -> None:
    def split(self, request, num_new_tokens, num_new_local_computed_tokens=0, num_external_computed_tokens=0):
        return _mutated_split(self, request, num_new_tokens, num_new_local_computed_tokens,
                              num_external_computed_tokens, **mutation)
    sched_mod.Scheduler._mamba_block_aligned_split = split


def _mutated_split(sched, request, n, local, external, *, drop_tail_stop=False, no_defer=False,
                   realign_one_block_late=False) -> int:
    """The restated split (tests hold it equal to vLLM's) with one rule broken."""
    if not (drop_tail_stop or no_defer or realign_one_block_late):
        return splits.restated_fixed_split(sched, request, n, local, external)
    block = sched.cache_config.block_size
    start = request.num_computed_tokens + local + external
    got = splits.restated_fixed_split(sched, request, n, local, external)
    end = start + got
    if no_defer and got == 0:
        return n  # budget too small for an aligned chunk: schedule the unaligned one anyway
    if drop_tail_stop and sched.mamba_partial_cache_hit and end % block and start + n > end:
        return min(n, (end // block + 1) * block - start)  # run on to the next block boundary
    if realign_one_block_late and start % block and end == start - start % block + block and start + n > end:
        return min(n, got + block)
    return got


def realign_one_block_late_split(self, request, num_new_tokens, num_new_local_computed_tokens=0,
                                 num_external_computed_tokens=0):
    """`split_realign_one_block_late` as a `--split` candidate (no process-wide patch): a split
    bug whose findings in checkpoint engines share the upstream mid-block class's signature."""
    return _mutated_split(self, request, num_new_tokens, num_new_local_computed_tokens,
                          num_external_computed_tokens, realign_one_block_late=True)


@mutant("split: a chunk the budget cannot align is scheduled unaligned instead of deferred")
def split_no_defer() -> None:
    _patch_split(no_defer=True)


@mutant("split: no stop at the prompt-tail hash boundary for partial hits")
def split_drop_tail_stop() -> None:
    _patch_split(drop_tail_stop=True)


@mutant("split: a chunk starting mid-block stops one block past its own boundary")
def split_realign_one_block_late() -> None:
    _patch_split(realign_one_block_late=True)


@mutant("manager: the prompt-tail checkpoint position is one hash unit late in MambaManager")
def manager_tail_position_late() -> None:
    original = stkm.get_mamba_prefill_checkpoint_position

    @functools.wraps(original)
    def late(num_tokens, hash_block_size, drop_eagle_block):
        return original(num_tokens, hash_block_size, drop_eagle_block) + hash_block_size
    stkm.get_mamba_prefill_checkpoint_position = late


@mutant("manager: remove_skipped_blocks keeps the mamba state of one token too few")
def manager_skip_one_token_more() -> None:
    stkm.MambaManager.get_num_skipped_tokens = lambda self, num_computed_tokens: num_computed_tokens


@mutant("manager: copy-on-write copies for partial hits are never handed to the worker")
def manager_drop_cow_copies() -> None:
    original = stkm.MambaManager.take_pending_cow_copies

    def drop(self):
        original(self)
        return []
    stkm.MambaManager.take_pending_cow_copies = drop


@mutant("manager: cache_blocks publishes one block ahead of the computed tokens")
def manager_cache_one_block_early() -> None:
    original = stkm.MambaManager.cache_blocks

    def early(self, request, num_tokens, retention_interval=None, *, replay_boundaries):
        ahead = min(num_tokens + self.block_size, request.num_tokens)
        return original(self, request, ahead, retention_interval, replay_boundaries=replay_boundaries)
    stkm.MambaManager.cache_blocks = early


@mutant("manager: a partial hit is reported one hash unit longer than what matched")
def manager_hit_one_unit_long() -> None:
    original = stkm.MambaManager.find_longest_cache_hit.__func__

    def longer(cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec, drop_eagle_block,
               alignment_tokens, *args, **kwargs):
        blocks, length = original(cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
                                  drop_eagle_block, alignment_tokens, *args, **kwargs)[:2]
        if length and length % kv_cache_spec.block_size and length + alignment_tokens < max_length:
            length += alignment_tokens
        return blocks, length
    stkm.MambaManager.find_longest_cache_hit = classmethod(longer)


def apply(name: str) -> None:
    if name not in MUTANTS:
        raise KeyError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}")
    MUTANTS[name][1]()


def apply_from_env() -> str | None:
    name = os.environ.get("MAMBAFUZZ_MUTANT")
    if name:
        apply(name)
    return name
