"""Hand-planted bugs for mutation testing: small, plausible mistakes in vLLM's scheduling and
KV-cache functions, each a list of reversible patches of the installed vLLM (mambafuzz.sim.patching),
registered by name in `MUTANTS`.

`MAMBAFUZZ_MUTANT=<name>` plants one (or a generated mutant, `mm:<Class.function>:<n>`, from
`operators`) in each process's start-up step (`planting`, called by
`mambafuzz.search.startup.prepare_process`), so the fuzzer's worker processes run against the
mutant; `bench/mutation_score.py` measures which of these the fuzzer kills from an empty corpus
on `--split fixed`, a kill counted only when `kills.confirms_kill` attributes it.
"""

from __future__ import annotations

from collections.abc import Callable

from mambafuzz.sim.engine import splits
from mambafuzz.sim.patching import SPLIT_TARGET, Patch, Rewrite, Wrap

MUTANTS: dict[str, tuple[str, Callable[[], list[Patch]]]] = {}
STKM = "vllm.v1.core.single_type_kv_cache_manager"
MAMBA = f"{STKM}:MambaManager"
POOL = "vllm.v1.core.block_pool:BlockPool"
SCHED = "vllm.v1.core.sched.scheduler:Scheduler"


def mutant(description: str):
    def register(fn: Callable[[], list[Patch]]) -> Callable[[], list[Patch]]:
        MUTANTS[fn.__name__] = (description, fn)
        return fn
    return register


def _split_patch(**mutation) -> list[Patch]:
    def split(self, request, num_new_tokens, num_new_local_computed_tokens=0, num_external_computed_tokens=0):
        return _mutated_split(self, request, num_new_tokens, num_new_local_computed_tokens,
                              num_external_computed_tokens, **mutation)
    return [Wrap(SPLIT_TARGET, lambda current: split, wraps_candidates=False)]


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
def split_no_defer() -> list[Patch]:
    return _split_patch(no_defer=True)


@mutant("split: no stop at the prompt-tail hash boundary for partial hits")
def split_drop_tail_stop() -> list[Patch]:
    return _split_patch(drop_tail_stop=True)


@mutant("split: a chunk starting mid-block stops one block past its own boundary")
def split_realign_one_block_late() -> list[Patch]:
    return _split_patch(realign_one_block_late=True)


@mutant("split: non-final chunk ends are aligned to the hash grid (prefix_match_unit), not the mamba block grid")
def split_hash_grid() -> list[Patch]:
    return [Rewrite(SPLIT_TARGET, ((
        "aligned_end = end // block_size * block_size",
        "aligned_end = end // self.hash_block_size * self.hash_block_size  # mutant: the hash grid",
    ),))]


@mutant("manager: the prompt-tail checkpoint position is one hash unit late in MambaManager")
def manager_tail_position_late() -> list[Patch]:
    def make(original):
        def late(num_tokens, hash_block_size, drop_eagle_block):
            return original(num_tokens, hash_block_size, drop_eagle_block) + hash_block_size
        return late
    return [Wrap(f"{STKM}:get_mamba_prefill_checkpoint_position", make)]


@mutant("manager: remove_skipped_blocks keeps the mamba state of one token too few")
def manager_skip_one_token_more() -> list[Patch]:
    return [Wrap(f"{MAMBA}.get_num_skipped_tokens", lambda current: lambda self, num_computed_tokens: num_computed_tokens)]


@mutant("manager: copy-on-write copies for partial hits are never handed to the worker")
def manager_drop_cow_copies() -> list[Patch]:
    def make(original):
        def drop(self):
            original(self)
            return []
        return drop
    return [Wrap(f"{MAMBA}.take_pending_cow_copies", make)]


@mutant("manager: cache_blocks publishes one block ahead of the computed tokens")
def manager_cache_one_block_early() -> list[Patch]:
    def make(original):
        def early(self, request, num_tokens, retention_interval=None, *, replay_boundaries):
            ahead = min(num_tokens + self.block_size, request.num_tokens)
            return original(self, request, ahead, retention_interval, replay_boundaries=replay_boundaries)
        return early
    return [Wrap(f"{MAMBA}.cache_blocks", make)]


@mutant("manager: a partial hit is reported one hash unit longer than what matched")
def manager_hit_one_unit_long() -> list[Patch]:
    def make(original):
        def longer(cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec, drop_eagle_block,
                   alignment_tokens, *args, **kwargs):
            blocks, length = original(cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
                                      drop_eagle_block, alignment_tokens, *args, **kwargs)[:2]
            if length and length % kv_cache_spec.block_size and length + alignment_tokens < max_length:
                length += alignment_tokens
            return blocks, length
        return longer
    return [Wrap(f"{MAMBA}.find_longest_cache_hit", make)]


# ---- outside the split and the hit/caching rules above ----------------------------------

@mutant("admission: MambaManager's block estimate is one block short")
def admission_estimate_one_short() -> list[Patch]:
    def make(original):
        def short(self, *args, **kwargs):
            n = original(self, *args, **kwargs)
            return n - 1 if 0 < n <= self.block_pool.num_gpu_blocks else n
        return short
    return [Wrap(f"{MAMBA}.get_num_blocks_to_allocate", make)]


@mutant("admission: a hit on a mamba block cached earlier in the same step is not deferred")
def admission_same_step_hit() -> list[Patch]:
    def make(original):
        def eager(self, *args, **kwargs):
            kept, self.cached_blocks_this_step = self.cached_blocks_this_step, set()
            try:
                return original(self, *args, **kwargs)
            finally:
                self.cached_blocks_this_step = kept
        return eager
    return [Wrap(f"{MAMBA}.get_num_blocks_to_allocate", make)]


@mutant("eviction: a reused cached block keeps its prefix-cache entry")
def pool_evict_keeps_hash() -> list[Patch]:
    return [Wrap(f"{POOL}._maybe_evict_cached_block", lambda current: lambda self, block: False)]


@mutant("reset: reset_prefix_cache clears every block's hash but keeps the key map, so hits still find the blocks")
def reset_keeps_key_map() -> list[Patch]:
    return [Rewrite(f"{POOL}.reset_prefix_cache", ((
        "self.cached_block_hash_to_block = BlockHashToBlockMap()",
        "pass  # mutant: the key map survives the reset",
    ),))]


@mutant("block pool: a prefix-hit block is not taken off the free queue")
def pool_touch_keeps_free() -> list[Patch]:
    def make(original):
        def touch(self, blocks):
            for block in blocks:
                block.ref_cnt += 1
        return touch
    return [Wrap(f"{POOL}.touch", make)]


@mutant("retention: the sparse retention mask keeps the block after each kept one")
def retention_mask_shifted() -> list[Patch]:
    def make(original):
        def shifted(cls, *args, **kwargs):
            mask = original(cls, *args, **kwargs)
            return mask if mask is None else [False, *mask[:-1]]
        return shifted
    return [Wrap(f"{MAMBA}.reachable_block_mask", make)]


# ---- resources: states stay right, compute or memory is wasted (mambafuzz/checks/resources.py) ----

@mutant("resources: the prompt's own checkpoint is evicted as a transient state (fewer hits on a resend)")
def resource_prompt_checkpoint_evicted() -> list[Patch]:
    return [Rewrite(f"{MAMBA}._cache_partial_tail_block", ((
        "is_prompt_checkpoint = (",
        "is_prompt_checkpoint = False and (  # mutant: the prompt's checkpoint is not kept",
    ),))]


@mutant("resources: align mode frees a skipped mamba state block one block late")
def resource_state_freed_late() -> list[Patch]:
    def make(original):
        def late(self, request_id, processed_computed_tokens, num_prompt_tokens=None):
            return original(self, request_id, max(0, processed_computed_tokens - self.block_size), num_prompt_tokens)
        return late
    return [Wrap(f"{MAMBA}.remove_skipped_blocks", make)]


@mutant("resources: a prefix hit takes one reference too many on its last block (a leak no table holds)")
def resource_hit_reference_leaked() -> list[Patch]:
    def make(original):
        def leaky(self, blocks):
            original(self, blocks)
            real = [b for b in blocks if not b.is_null]
            if real:
                real[-1].ref_cnt += 1
        return leaky
    return [Wrap(f"{POOL}.touch", make)]


@mutant("resources: full attention takes one block of slots more than a request's tokens need")
def resource_attention_block_extra() -> list[Patch]:
    def make(original):
        def extra(self, request_id, num_tokens, num_tokens_main_model):
            return original(self, request_id, num_tokens + self.block_size, num_tokens_main_model)
        return extra
    return [Wrap(f"{STKM}:FullAttentionManager.allocate_new_blocks", make)]


@mutant("bookkeeping: align mode forgets to drop a freed request's last_state_block_idx (a per-request leak)")
def resource_request_state_kept() -> list[Patch]:
    def make(original):
        def kept(self, request_id):
            last = getattr(self, "last_state_block_idx", {}).get(request_id)
            blocks = original(self, request_id)
            if last is not None:
                self.last_state_block_idx[request_id] = last
            return blocks
        return kept
    return [Wrap(f"{MAMBA}.pop_blocks_for_free", make)]


class _HashesOneUnitEarly:
    """A request whose `block_hashes` read one hash unit early from the second unit on (its other
    attributes are the request's own)."""

    def __init__(self, request):
        self._request = request
        hashes = list(request.block_hashes)
        self.block_hashes = hashes[:1] + hashes[:-1]

    def __getattr__(self, name):
        return getattr(self._request, name)


@mutant("cache keys: full attention publishes each block under the hash one hash unit before its own")
def cache_attention_key_one_unit_early() -> list[Patch]:
    def make(original):
        def early(self, request, *args, **kwargs):
            return original(self, _HashesOneUnitEarly(request), *args, **kwargs)
        return early
    return [Wrap(f"{STKM}:FullAttentionManager.cache_blocks", make)]


@mutant("worker tables: a running request with a partial hit takes the first-allocation path again (CoW in place)")
def table_first_allocation_rerun() -> list[Patch]:
    """The request's cache-hit block is swapped for its copy inside a table the worker only
    appends to (`_apply_cow` on a running request): the scheduler's table and the worker's part."""
    def make(original):
        def rerun(self, request_id, num_tokens, num_tokens_main_model):
            if request_id in self._partial_hit_reqs:
                self._allocated_block_reqs.discard(request_id)
            return original(self, request_id, num_tokens, num_tokens_main_model)
        return rerun
    return [Wrap(f"{MAMBA}.allocate_new_blocks", make)]


@mutant("resources: the block pool reports one free block more than its free queue holds")
def resource_free_count_inflated() -> list[Patch]:
    def make(original):
        def inflated(self):
            return original(self) + 1
        return inflated
    return [Wrap(f"{POOL}.get_num_free_blocks", make)]


# ---- async KV loads under spec decode: the reservation of vllm-project/vllm#57104, undone ----
# vLLM 0.32.0 admits an async KV load (it parks in WAITING_FOR_REMOTE_KVS, holding its blocks, no
# forward, not preemptible) only if its blocks fit in the free pool less `reserved_blocks`
# (scheduler.py:1241-1251): the blocks every other in-flight prefill still needs to be promoted
# (`_inflight_prefill_reserved_blocks`, :3088-3092, whose `_request_remaining_blocks` counts each
# one's first spec-decode step, 1 + num_spec_tokens + num_lookahead_tokens slots, :3064-3065) plus
# the admitted load's own spec-decode step (`_spec_decode_step_blocks`, the attention groups'
# blocks for those slots, :347-357). The load itself allocates no lookahead slots (:1224-1227), so
# a finished load needs them at promotion; without the reservation two parked loads can fill the
# pool and neither is ever promoted (the deadlock vllm-project/vllm#57104 fixed). Two halves:


def _without_own_spec_step_blocks() -> list[Patch]:
    """An async load's admission no longer keeps its own first spec-decode step's blocks free
    (`_spec_decode_step_blocks` is read only in that reservation, scheduler.py:1250)."""
    def make(original):
        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            self._spec_decode_step_blocks = 0
        return init
    return [Wrap(f"{SCHED}.__init__", make)]


def _without_inflight_spec_slots() -> list[Patch]:
    """Another in-flight prefill's reservation counts its sequence alone, not the slots of its
    first spec-decode step."""
    return [Rewrite(f"{SCHED}._request_remaining_blocks", ((
        "num_tokens += 1 + self.num_spec_tokens + self.num_lookahead_tokens",
        "pass  # mutant: the spec-decode step's slots are not reserved",
    ),))]


@mutant("deadlock (vllm-project/vllm#57104 undone): an async KV load's reservation leaves out the spec-decode "
        "step's slots, its own and those of the other in-flight prefills")
def deadlock_async_load_spec_slots_both() -> list[Patch]:
    return _without_own_spec_step_blocks() + _without_inflight_spec_slots()


@mutant("deadlock (half of vllm-project/vllm#57104 undone): an async KV load's admission does not keep its own "
        "spec-decode step's blocks free")
def deadlock_async_load_spec_slots_own() -> list[Patch]:
    return _without_own_spec_step_blocks()


@mutant("deadlock (half of vllm-project/vllm#57104 undone): the reservation for other in-flight prefills leaves "
        "out their spec-decode step's slots")
def deadlock_async_load_spec_slots_others() -> list[Patch]:
    return _without_inflight_spec_slots()


# ---- worker code: the metadata builders and V2's model state (the conform target calls them) ----
GDN_BUILDER = "vllm.v1.attention.backends.gdn_attn:GDNAttentionMetadataBuilder"
MAMBA_BUILDER = "vllm.v1.attention.backends.mamba_attn:BaseMambaAttentionMetadataBuilder"
V2_MAMBA_STATE = "vllm.v1.worker.gpu.model_states.mamba_hybrid:MambaHybridModelState"


@mutant("worker, gdn_attn.py: a decode row with zero drafts takes the plain decode path (no accepted offset)")
def worker_gdn_zero_draft_plain_decode() -> list[Patch]:
    return [Rewrite(f"{GDN_BUILDER}.build", ((
        "spec_sequence_masks_cpu = num_decode_draft_tokens_cpu >= 0",
        "spec_sequence_masks_cpu = num_decode_draft_tokens_cpu > 0  # mutant: zero drafts is not spec",
    ),))]


@mutant("worker, mamba_attn.py: a first prompt chunk of one token counts as having prior state (runs as a decode)")
def worker_mamba_first_token_has_state() -> list[Patch]:
    return [Rewrite(f"{MAMBA_BUILDER}._compute_common_metadata", ((
        "has_prior_state = seq_lens_cpu > query_lens_cpu",
        "has_prior_state = seq_lens_cpu >= query_lens_cpu  # mutant: a first chunk has prior state",
    ),))]


@mutant("worker, V2 mamba_hybrid.py: a padded one-token prompt tail runs as a prefill, not a spec decode")
def worker_v2_padded_tail_as_prefill() -> list[Patch]:
    return [Rewrite(f"{V2_MAMBA_STATE}.prepare_attn", ((
        "is_prefilling_np = is_prefilling_np & ~input_batch.prefill_runs_as_decode_np",
        "pass  # mutant: the padded tail stays a prefill",
    ),))]


@mutant("worker, V2 mamba_hybrid.py: a new request's state column is seeded in cache_config.block_size units (vllm-project/vllm#55601 undone)")
def worker_v2_state_column_in_cache_blocks() -> list[Patch]:
    """A wrapper, not a source rewrite: add_request calls a bare super(), which a recompiled copy
    cannot (no __class__ cell). For the call, the mamba block reads as cache_config.block_size."""
    def make(original):
        def seeded(self, req_index, new_req_data):
            cc = self.cache_config
            mamba_block_size, cc.mamba_block_size = cc.mamba_block_size, cc.block_size
            try:
                return original(self, req_index, new_req_data)
            finally:
                cc.mamba_block_size = mamba_block_size
        return seeded
    return [Wrap(f"{V2_MAMBA_STATE}.add_request", make)]


def _rollback_patch(rolled_back: str) -> list[Patch]:
    """update_from_output with `rolled_back` in place of the rollback of rejected drafts."""
    return [Rewrite(f"{SCHED}.update_from_output", ((
        "request.num_computed_tokens -= num_rejected",
        rolled_back,
    ),))]


@mutant("spec decode: rejected draft tokens are not rolled back from num_computed_tokens")
def spec_no_rollback() -> list[Patch]:
    return _rollback_patch("pass  # mutant: rejected drafts stay computed")


@mutant("spec decode: only half of the rejected draft tokens are rolled back from num_computed_tokens")
def spec_half_rollback() -> list[Patch]:
    return _rollback_patch("request.num_computed_tokens -= num_rejected // 2  # mutant: half rolled back")


@mutant("preemption: a preempted request resumes with its old num_computed_tokens")
def preempt_keeps_computed() -> list[Patch]:
    return [Rewrite(f"{SCHED}._preempt_request", ((
        """
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        """,
        """
        request.status = RequestStatus.PREEMPTED
        """),))]


@mutant("copy-on-write: partial-hit copies are issued backwards (private block onto the shared one)")
def cow_copies_backwards() -> list[Patch]:
    def make(original):
        def backwards(self):
            return [(dst, src) for src, dst in original(self)]
        return backwards
    return [Wrap(f"{MAMBA}.take_pending_cow_copies", make)]


# ---- a KV connector that defers its answer (get_num_new_matched_tokens -> None) ----------------
# vLLM 0.32's waiting loop skips such a request for the rest of the schedule() (scheduler.py:986-990):
# `skip_request` pops it and re-queues it after the pass (903-910, 1394-1395), so the scan moves on to the
# requests behind it, and nothing is allocated for it. Each mutant breaks one half of that.
_DEFERRED_SKIP = """
if ext_tokens is None:
    # The request cannot be scheduled because
    # the KVConnector couldn't determine
    # the number of matched tokens.
    skip_request(request_queue)
    continue
"""


def _deferred_branch(body: str) -> list[Patch]:
    return [Rewrite(f"{SCHED}.schedule", ((_DEFERRED_SKIP, "if ext_tokens is None:\n" + body),))]


@mutant("connector deferral: a lookup answered None is taken as a miss, and the request is admitted without "
        "its external hit")
def defer_taken_as_miss() -> list[Patch]:
    return _deferred_branch("    ext_tokens, load_kv_async = 0, False  # mutant: None read as 0")


@mutant("connector deferral: a deferred request is popped from the waiting queue and never put back")
def defer_not_requeued() -> list[Patch]:
    return _deferred_branch("    request_queue.pop_request()  # mutant: not re-queued\n    continue")


@mutant("connector deferral: the scan does not move past a deferred request (it is peeked again)")
def defer_not_skipped() -> list[Patch]:
    return _deferred_branch("    continue  # mutant: not popped")
