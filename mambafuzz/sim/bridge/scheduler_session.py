"""One real vLLM scheduler and the handles the engine loop needs around it (`SchedulerSession`):
request creation, output feeding, drafts, and read-only views of the mamba block tables, the pool
and the prefix cache (each view reads vLLM's own objects, counting the cache's key changes so the
audit rescans only when they move); and what a SchedulerOutput tells a worker or a connector
(preemptions, spec tokens, boundary-state hand-offs). Its configs come from `configs`; its vLLM
names from `mambafuzz.sim.bridge.vllm_compat`.

Everything else in the project talks to `SchedulerSession`, never to vLLM objects.
"""

from __future__ import annotations

import operator
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet

from mambafuzz.model import runners
from mambafuzz.model.scenario import EngineConfig
from mambafuzz.sim import patching
from mambafuzz.sim.bridge import architectures
from mambafuzz.sim.bridge.configs import (
    ROW_INDEX_FIELD,
    RUNNER_CHOICE,
    VLLM,
    ConfigRejected,
    at_max_model_len,
    batch_queue_depth,
    checked_config,
    default_runner,
    kv_cache_config_for,
    startup_budget,
)
from mambafuzz.sim.bridge.vllm_compat import features
from mambafuzz.sim.bridge.vllm_compat.api import (
    DraftTokenIds,
    KVCacheBlock,
    KVConnectorOutput,
    MambaManager,
    ModelRunnerOutput,
    Request,
    RequestStatus,
    SamplingParams,
    Scheduler,
    SchedulerOutput,
    StructuredOutputManager,
    get_request_block_hasher,
    make_block_hash_with_group_id,
    resolve_kv_cache_block_sizes,
    sha256,
)

# The function the fuzzer swaps out; its signature is what `--split mod:fn` must match.
SPLIT_METHOD = "_mamba_block_aligned_split"
SplitFn = Callable[..., int]


class CachedMambaEntry(typing.NamedTuple):
    """One prefix-cache key that points at a mamba block (a NamedTuple: built without a Python frame)."""

    block_hash: bytes
    block_id: int
    primary: bool  # the block's own key (block_hash_num_tokens describes it), not a secondary one
    claimed_tokens: int | None  # block_hash_num_tokens for a primary key


_BLOCK_ID = operator.attrgetter("block_id")
_NO_IDS: frozenset[str] = frozenset()

# The statuses vLLM counts as finished (`RequestStatus.is_finished`, asked once per status):
# `req.status in FINISHED_STATUSES` is `req.is_finished()` without its two Python calls, for hot loops.
FINISHED_STATUSES = frozenset(status for status in RequestStatus if RequestStatus.is_finished(status))


class SortedIds(set):
    """A worker's finished request ids that iterate in sorted order.  vLLM frees the blocks of
    `finished_sending` (and of finished requests in `finished_recving`) in the order it iterates
    the set (`Scheduler._update_from_kv_xfer_finished`), and a plain set of str iterates in the
    order of the process's hash seed: two processes would free, and then allocate, different
    block ids for the same input.  Any order is one a real worker may report; this one replays."""

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set.__iter__(self)))


# Per class of the KV-cache manager, its coordinator and single-type managers: the attributes that hold a dict,
# a set or a list (`SchedulerSession.request_state_left` reads them for a freed request's entries)
_CONTAINERS: dict[type, tuple[str, ...]] = {}


class CacheReset(typing.NamedTuple):
    """What one `reset_prefix_cache` call did: its answer, and the prefix cache around it."""

    succeeded: bool  # Scheduler.reset_prefix_cache's return value
    preempted: tuple[str, ...]  # the running requests it preempted first (reset_running_requests)
    keys_before: frozenset[tuple[bytes, int]]  # every group's (key, block id) before the call
    keys_after: frozenset[tuple[bytes, int]]  # and after it
    hashed_after: tuple[int, ...]  # blocks that still carry a hash, primary or secondary, after it
    mamba_keys_after: frozenset[tuple[bytes, int]]  # of keys_after, the first mamba group's (the audit's)


class NoSchedulerOutput(Exception):
    """`schedule()` returned something that is not a SchedulerOutput: vLLM broke its contract with
    the engine core (the harness files it as a contract finding, SCHEDULE_RETURNS_OUTPUT)."""


class SchedulerSession:
    """One real vLLM Scheduler plus the handles the harness needs to drive and observe it."""

    def __init__(self, engine: EngineConfig, num_blocks: int, max_model_len: int, split: SplitFn | None,
                 connector: bool = True):
        """`connector`: configure the scenario's KV connector (a scenario whose requests claim
        external tokens); without it vLLM runs with no connector, as most deployments do."""
        vc = checked_config(engine, max_model_len, connector)
        vc.cache_config.num_gpu_blocks = num_blocks
        # The scheduler and its KV-cache manager cap slots and rows at the model's max_model_len
        vc = at_max_model_len(vc, max_model_len)
        try:
            kv_cache_config = kv_cache_config_for(engine, num_blocks, max_model_len)
        except features.FeatureAbsent as exc:
            raise ConfigRejected(f"cannot run: {exc}") from None
        try:  # the engine core resolves both sizes this way before building its scheduler
            block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vc)
        except ValueError as exc:
            raise ConfigRejected(f"vLLM refuses this engine config: {str(exc).splitlines()[0]}") from None
        # vLLM's own choice of class for the mode (SchedulerConfig.get_scheduler_cls): AsyncScheduler
        # when async scheduling is on.
        scheduler_cls = vc.scheduler_config.get_scheduler_cls() if hasattr(vc.scheduler_config, "get_scheduler_cls") \
            else Scheduler
        self.scheduler = scheduler_cls(
            vllm_config=vc,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vc),
            block_size=block_size,
            hash_block_size=hash_block_size,
        )
        if split is not None:  # wrapped by any active fix of the split (mambafuzz.sim.patching)
            setattr(self.scheduler, SPLIT_METHOD, types.MethodType(patching.wrap_split(split), self.scheduler))
        self.kv_cache_groups = tuple(kv_cache_config.kv_cache_groups)
        self.model_description = architectures.describe(engine.model, self.kv_cache_groups, engine.num_speculative_tokens
                                                        if engine.uses_spec_decode else 0)
        self.runner = engine.runner or default_runner(vc)
        # The scheduler reads the flag at start-up; it changes only how SchedulerOutput hands
        # resumed requests to the worker (as new requests under V2), not what is scheduled.
        if RUNNER_CHOICE:  # 0.34's Scheduler has no such flag: it always hands requests over as for V2
            self.scheduler.use_v2_model_runner = runners.get(self.runner).use_v2_model_runner
        self.async_scheduling = bool(vc.scheduler_config.async_scheduling)
        self.batch_queue_depth = batch_queue_depth(vc, self.runner)
        self.hash_block_size = hash_block_size
        self.mamba_block_size = engine.mamba_block_size
        managers = self.scheduler.kv_cache_manager.coordinator.single_type_managers
        # Every mamba KV-cache group (vLLM's grouping gives an architecture several); the first is the one the
        # cache audit and the trace follow, the kernel model mirrors them all (mamba_tables).
        self.mamba_groups = tuple(i for i, m in enumerate(managers) if isinstance(m, MambaManager))
        self.mamba_group = self.mamba_groups[0]
        self._mamba_manager = managers[self.mamba_group]
        self._mamba_managers = tuple(managers[i] for i in self.mamba_groups)
        # The block grid a prefill checkpoint aligns to (vLLM >= 0.29 names it; before, the scheduler block).
        self.cache_hit_alignment_tokens: int = getattr(self._mamba_manager, "cache_hit_alignment_tokens", block_size)
        self.block_pool = self.scheduler.kv_cache_manager.block_pool
        self.null_block_id = self.block_pool.null_block.block_id
        self.allocated_blocks: set[int] = set()  # ever handed out by the pool
        self.reused_blocks: set[int] = set()  # handed out more than once: no longer the cache's initial zeros
        # [cached blocks the pool evicted to hand them out (LRU eviction in get_new_blocks)]; None on a
        # vLLM whose free queue or pool keeps none of what they are counted by
        queue = getattr(self.block_pool, "free_block_queue", None)
        self.lru_evictions: list[int] | None = [0] if (
            hasattr(queue, "fake_free_list_head") and hasattr(self.block_pool, "cached_block_hashes_by_block")) else None
        self._watch_reuse()
        self.over_estimates: list[tuple[str, int, int]] = []  # (request, blocks estimated, blocks taken)
        self._watch_estimates()
        self.startup_min_blocks, self.group_reserves = startup_budget(vc, kv_cache_config.kv_cache_groups, max_model_len)
        self.group_kinds = tuple("mamba" if isinstance(m, MambaManager) else type(m.kv_cache_spec).__name__
                                 for m in managers)
        self.group_block_sizes = tuple(m.block_size for m in managers)
        self._managers = tuple(managers)
        self._mamba_key_suffix = bytes(make_block_hash_with_group_id(b"", self.mamba_group))
        self.connector = self.scheduler.connector
        self._block_hasher = get_request_block_hasher(hash_block_size, sha256)
        self._watched_keys: object = None  # the key map cache_keys_version watches
        self._key_changes = [0]
        # the mamba blocks keyed in the prefix cache since the list was last cleared (once the watch is on):
        # `take_inserted` hands them out; a caller on a hot path may read and clear the list itself
        self.inserted_blocks: list[int] = []
        # [the (key, block) pairs of mamba keys new to the map since the last take_added_mamba_keys(), or
        # None when the map changed some other way since (a pop, a second block on a key) or is not watched]
        self._added: list = [None]
        # Our own references: vLLM drops finished requests from `scheduler.requests` inside
        # update_from_output, before their last sampled token could be read back.
        self._requests: dict[str, Request] = {}

    def _watch_reuse(self) -> None:
        """Record every block the pool hands out a second time. The worker allocates the whole
        KV cache zeroed (v1/worker/utils.py `allocate_kv_cache`: torch.zeros) and all groups
        share it, so a block on its first owner holds zeros until written; a block any group
        used before holds that group's bytes (mamba blocks are never zeroed on reuse)."""
        pool_get = self.block_pool.get_new_blocks
        ever, reused = self.allocated_blocks, self.reused_blocks
        # get_new_blocks hands out the first blocks of the free queue and evicts each that is cached
        # (`_maybe_evict_cached_block`: a primary `block_hash`, or secondary keys in
        # `cached_block_hashes_by_block`); they are counted before it does
        pool, evictions = self.block_pool, self.lru_evictions

        def get_new_blocks(num_blocks: int) -> list[KVCacheBlock]:
            if evictions is not None and pool.enable_caching:
                secondary = pool.cached_block_hashes_by_block
                block = pool.free_block_queue.fake_free_list_head.next_free_block
                for _ in range(min(num_blocks, pool.get_num_free_blocks())):
                    if block is None:
                        break
                    if block.block_hash is not None or block.block_id in secondary:
                        evictions[0] += 1
                    block = block.next_free_block
            blocks = pool_get(num_blocks)
            for b in blocks:
                if b.block_id in ever:
                    reused.add(b.block_id)
                else:
                    ever.add(b.block_id)
            return blocks

        self.block_pool.get_new_blocks = get_new_blocks

    def _watch_estimates(self) -> None:
        """Record every allocation that takes more blocks than vLLM checked for. `allocate_slots`
        (v1/core/kv_cache_manager.py:561-600 in 0.32) frees skipped blocks, asks the coordinator how
        many blocks the request needs, refuses when fewer are free, and only then takes them; nothing
        frees in between. So the blocks it takes (the free count at the estimate less the free count
        after) are at most the estimate (over-estimating is by design, single_type_kv_cache_manager.py:
        1722-1723). One taken past it is a block the admission check never saw: on a pool tight
        enough, `get_new_blocks` raises inside schedule()."""
        manager, coordinator, pool = self.scheduler.kv_cache_manager, self.scheduler.kv_cache_manager.coordinator, \
            self.block_pool
        allocate, estimate = manager.allocate_slots, coordinator.get_num_blocks_to_allocate
        seen: list = [None]  # (estimate, free count then) of the allocate_slots call in progress
        over = self.over_estimates

        def counted_estimate(*args, **kwargs):
            n = estimate(*args, **kwargs)
            if seen[0] is not None and not kwargs.get("apply_admission_cap", False):
                seen[0] = (n, pool.get_num_free_blocks())
            return n

        def checked_allocate(request, *args, **kwargs):
            seen[0] = ()
            try:
                blocks = allocate(request, *args, **kwargs)
                if blocks is not None and seen[0]:
                    n, free = seen[0]
                    taken = free - pool.get_num_free_blocks()
                    if taken > n:
                        over.append((request.request_id, n, taken))
                return blocks
            finally:
                seen[0] = None

        coordinator.get_num_blocks_to_allocate = counted_estimate
        manager.allocate_slots = checked_allocate

    # ---- driving ----------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: list[int], max_tokens: int, arrival: float,
                    priority: int = 0) -> None:
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt),
            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0),
            pooling_params=None,
            arrival_time=arrival,
            block_hasher=self._block_hasher,
            priority=priority,
        )
        self._requests[request_id] = request
        self.scheduler.add_request(request)

    def abort(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def schedule(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        if not isinstance(out, SchedulerOutput):  # the worker could not even start on it
            raise NoSchedulerOutput(f"Scheduler.schedule() returned {type(out).__name__}, not a SchedulerOutput")
        return out

    def feed(self, out: SchedulerOutput, sampled: dict[str, list[int]], finished_recving: set[str],
             failed_recving: set[str] | None = None, finished_sending: set[str] | None = None) -> None:
        """update_from_output with the batch's tokens and what the worker's KV connector finished:
        loads (`finished_recving`; a failed one is in `failed_recving` as well) and sends."""
        req_ids = list(out.num_scheduled_tokens)
        connector_output = None
        if finished_recving or finished_sending or failed_recving:  # a failed sync load: failed_recving alone
            connector_output = KVConnectorOutput(finished_recving=SortedIds(finished_recving) or None)
            if failed_recving:
                connector_output.failed_recving = SortedIds(failed_recving)
            if finished_sending:
                connector_output.finished_sending = SortedIds(finished_sending)
        self.scheduler.update_from_output(
            out,
            ModelRunnerOutput(
                req_ids=req_ids,
                sampled_token_ids=[sampled.get(r, []) for r in req_ids],
                kv_connector_output=connector_output,
                # 0.34 dropped the field and indexes by position in req_ids (scheduler.py:2356-2358).
                **({"req_id_to_index": {r: i for i, r in enumerate(req_ids)}} if ROW_INDEX_FIELD else {}),
            ),
        )

    def reset_prefix_cache(self, reset_running_requests: bool) -> CacheReset:
        """The engine's `reset_prefix_cache` utility call (EngineCore.reset_prefix_cache, core.py:871-876, with
        `reset_connector` False), between two engine steps. vLLM replaces the key map on success
        (`BlockPool.reset_prefix_cache`, block_pool.py:846), so the key watch moves to the new map at once
        (the next schedule's keys are counted) and the audit's next scan is a full one. An exception
        vLLM raises is left to the caller (the harness files it as a crash)."""
        running = tuple(r.request_id for r in self.scheduler.running) if reset_running_requests else ()
        before = self.cache_keys()
        succeeded = bool(self.scheduler.reset_prefix_cache(reset_running_requests=reset_running_requests))
        if self._watched_keys is not None:
            self.cache_keys_version()
        self._added[0] = None
        self._key_changes[0] += 1
        pool = self.block_pool
        hashed = {b.block_id for b in pool.blocks if b.block_hash is not None}
        hashed.update(getattr(pool, "cached_block_hashes_by_block", {}) or ())
        after = self.cache_keys()
        suffix = self._mamba_key_suffix
        return CacheReset(succeeded, running, before, after, tuple(sorted(hashed)),
                          frozenset(k for k in after if k[0][-4:] == suffix))

    def cache_keys(self) -> frozenset[tuple[bytes, int]]:
        """Every (key, block id) in the prefix cache, every KV-cache group's (read only at reset events)."""
        keys = self.block_pool.cached_block_hash_to_block
        dup_ids = getattr(keys, "_dup_ids", None)
        out = set()
        for key, value in keys._cache.items():
            if dup_ids is not None:
                out.update((bytes(key), int(b)) for b in dup_ids.get(key, (value,)))
            elif isinstance(value, dict):
                out.update((bytes(key), b.block_id) for b in value.values())
            else:
                out.add((bytes(key), value.block_id))
        return frozenset(out)

    def set_drafts(self, drafts: dict[str, list[int]]) -> None:
        if drafts:
            ids = list(drafts)
            self.scheduler.update_draft_token_ids(DraftTokenIds(ids, [drafts[r] for r in ids]))

    # ---- observing --------------------------------------------------------------------
    def request(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def has_requests(self) -> bool:
        """What the engine core asks before scheduling: unfinished requests, or finished ones whose
        ids the next SchedulerOutput still has to hand the worker."""
        return self.scheduler.has_requests()

    def mamba_block_ids(self, request_id: str) -> list[int]:
        return list(map(_BLOCK_ID, self._mamba_manager.req_to_blocks.get(request_id, ())))

    def mamba_blocks(self, request_id: str) -> Sequence[KVCacheBlock]:
        """The request's block list in the first mamba group, vLLM's own (read it, never change it)."""
        return self._mamba_manager.req_to_blocks.get(request_id, ())

    def mamba_block_lists(self, request_id: str) -> tuple[Sequence[KVCacheBlock], ...]:
        """`mamba_blocks` in every mamba group, in group order: vLLM's own lists, read per scheduled row
        without copying (`mamba_tables` builds the ids)."""
        return tuple([m.req_to_blocks.get(request_id, ()) for m in self._mamba_managers])

    def mamba_tables(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table in every mamba group, in group order (the first is `mamba_block_ids`).
        Built per scheduled row, so without a comprehension's frame per group."""
        managers = self._mamba_managers
        if len(managers) == 3:  # the tiny model's three groups, unrolled: the same lists without the loop
            a, b, c = managers
            return ([*map(_BLOCK_ID, a.req_to_blocks.get(request_id, ()))],
                    [*map(_BLOCK_ID, b.req_to_blocks.get(request_id, ()))],
                    [*map(_BLOCK_ID, c.req_to_blocks.get(request_id, ()))])
        tables = []
        for m in managers:
            tables.append([*map(_BLOCK_ID, m.req_to_blocks.get(request_id, ()))])
        return tuple(tables)

    def cache_keys_version(self) -> int:
        """A number that changes whenever a key of the mamba group is added to or removed from
        the prefix cache: the per-step cache audit rescans `cached_mamba_blocks` only when it
        moved. The watch is installed on the first call (wrapping the key map's `insert` and
        `pop`, the only ways vLLM changes it), and again should vLLM replace the map."""
        keys = self.block_pool.cached_block_hash_to_block
        if keys is not self._watched_keys:
            changes, suffix, inserted, added = self._key_changes, self._mamba_key_suffix, self.inserted_blocks, self._added
            insert, pop = keys.insert, keys.pop
            # Where a key maps to its block itself (vLLM before 0.34: no `_dup_ids`), a key new to the map is
            # yielded last by `cached_mamba_blocks`, as the block it was inserted with: `take_added_mamba_keys`
            # hands those out. Any other layout, and any other change, leaves it None.
            cache = None if hasattr(keys, "_dup_ids") else getattr(keys, "_cache", None)

            def counted_insert(key, *args, **kwargs):
                if key[-4:] == suffix:
                    changes[0] += 1
                    block = args[0] if args else kwargs.get("block")
                    if block is not None:
                        inserted.append(block.block_id)
                    pairs = added[0]
                    if pairs is not None:
                        if block is None or type(cache) is not dict or key in cache:
                            added[0] = None  # a second block on a key keeps the key's place in the map
                        else:
                            pairs.append((key, block))
                return insert(key, *args, **kwargs)

            def counted_pop(key, *args, **kwargs):
                if key[-4:] == suffix:
                    changes[0] += 1
                    added[0] = None  # a key put back after a pop moves to the map's end
                return pop(key, *args, **kwargs)

            keys.insert, keys.pop = counted_insert, counted_pop
            self._watched_keys = keys
            # a new map: nothing is known of it until a full scan, unless it is empty (the harness installs
            # the watch before the first schedule()): then a scan would yield nothing, and the added pairs next
            added[0] = [] if type(cache) is dict and not cache else None
            changes[0] += 1
        return self._key_changes[0]

    def take_added_mamba_keys(self) -> list[tuple[bytes, KVCacheBlock]] | None:
        """The (key, block) pairs of the mamba keys added to the prefix cache since the last call, in
        order, when nothing else changed the mamba keys since (no pop, no second block on a key): then
        `cached_mamba_blocks` yields what it yielded at that call followed by these pairs. (Before the
        first call, "that call" is the watch's install on an empty map, which yielded nothing.) None when
        a full scan is needed (always before the watch is on, after it was installed on a map holding
        keys, or on a vLLM whose key map keeps block ids)."""
        added = self._added
        pairs = added[0]
        added[0] = [] if self._watched_keys is not None else None
        return pairs

    def take_inserted(self) -> tuple[int, ...]:
        """The mamba blocks keyed in the prefix cache since the last call (once the watch is on)."""
        inserted = self.inserted_blocks
        if not inserted:
            return ()
        out = tuple(inserted)
        inserted.clear()
        return out

    def cached_mamba_blocks(self) -> Iterator[tuple[bytes, KVCacheBlock]]:
        """(key, block) for every live prefix-cache key of the mamba group: the raw form, so the
        per-step audit can skip the entries it has already judged without building anything."""
        suffix = self._mamba_key_suffix
        keys = self.block_pool.cached_block_hash_to_block
        # vLLM 0.34 keeps block ids, not blocks: one id per key in `_cache`, and every id of a key
        # several blocks share in `_dup_ids` (v1/core/block_pool.py:52-64). Before, a block or a dict of them.
        dup_ids = getattr(keys, "_dup_ids", None)
        blocks = self.block_pool.blocks
        for key, value in keys._cache.items():
            if key[-4:] != suffix:  # the group id is the key's last 4 bytes (make_block_hash_with_group_id)
                continue
            if dup_ids is not None:
                for block_id in dup_ids.get(key, (value,)):
                    yield key, blocks[block_id]
            elif isinstance(value, dict):
                for block in value.values():
                    yield key, block
            else:
                yield key, value

    def walk_pool(self) -> tuple[tuple[int, int, int], tuple[int, int, int, int] | None]:
        """The pool's own accounting, for the resource oracles, in one pass over its blocks.

        First (the free count it reports, blocks other than the null block with no reference, blocks
        with a negative reference count). The free queue holds exactly the unreferenced blocks
        (BlockPool.free_blocks appends a block when its count reaches 0, `touch` and get_new_blocks
        take it out), so the first two are equal. The null block's count means nothing (free_blocks
        decrements it like any block, `touch` skips nothing for it, and the pool never frees it), so
        it is left out throughout.

        Second, the first block (by id) whose reference count is not the number of places that hold
        it: its entries in every request's table, in every KV-cache group, plus its entries in the
        scheduler's deferred frees (`Scheduler.deferred_frees`, blocks of a freed request or a
        copy-on-write retention an in-flight step may still write), as (block id, its count, table
        entries, deferred entries); None when every count is its holders'. vLLM 0.32 keeps them
        equal: a block is touched or handed out exactly as it joins a table
        (single_type_kv_cache_manager.py:303-310, 364-365, 405-406), released exactly as it leaves
        one or a deferred free drains (562-589, 1592-1641; sched/scheduler.py:2766-2801), and a
        copy-on-write retention is released or deferred before schedule() returns (1474-1482)."""
        pool = self.block_pool
        blocks = pool.blocks
        holders = [0] * len(blocks)  # by block id (the pool's list is in id order)
        for m in self._managers:
            for table in m.req_to_blocks.values():
                for block in table:
                    holders[block.block_id] += 1
        deferred_frees = getattr(self.scheduler, "deferred_frees", ())
        for _, deferred in deferred_frees:
            for block in deferred:
                holders[block.block_id] += 1
        null = self.null_block_id
        # The counts read in one comprehension, then judged by C-level list operations (equality,
        # count, min): the walk's one Python-level loop is the read itself. The null block's entry is
        # set to 0 in both lists, so it is left out of every figure without a test per block (its count
        # is negative on most steps, which would otherwise send every walk through the negative count)
        counts = [block.ref_cnt for block in blocks]
        counts[null] = holders[null] = 0
        mismatch = None
        if counts != holders:
            i = next(i for i, (count, expected) in enumerate(zip(counts, holders)) if count != expected)
            deferred = sum(b.block_id == i for _, d in deferred_frees for b in d)
            mismatch = i, counts[i], holders[i] - deferred, deferred
        unreferenced = counts.count(0) - 1  # less the null block's stand-in 0
        negative = sum(c < 0 for c in counts) if min(counts) < 0 else 0
        return (pool.get_num_free_blocks(), unreferenced, negative), mismatch

    def request_state_left(self) -> list[tuple[str, str]]:
        """(where, request) for every entry a freed request left in the KV-cache manager's
        per-request state, for `pool_accounting:request-state-at-end` (read once, when a run ended
        with every request done). vLLM 0.32 drops a request's entries as it frees its blocks
        (`pop_blocks_for_free`: single_type_kv_cache_manager.py:576-578 for `req_to_blocks`,
        `num_cached_block`, `_partial_hit_reqs`; mamba align 1934-1951 for `_allocated_block_reqs`,
        `last_state_block_idx`, `_num_retired_blocks`, `_checkpoints`, `_producer_partial_tail_reqs`
        and the pending boundary-state hand-offs), and the scheduler its request
        (`Scheduler._free_blocks`, sched/scheduler.py:2746-2749). Read by shape, not by name, so a
        container a later vLLM adds is read too: every dict or set of the manager, its coordinator and
        each single-type manager whose keys are this session's request ids, every list whose entries
        are tuples that start with one, and the scheduler's `requests`. Where: `Class.attribute`."""
        ids = self._requests.keys()
        manager = self.scheduler.kv_cache_manager
        left: list[tuple[str, str]] = []
        for owner in (manager, manager.coordinator, *self._managers):
            names = _CONTAINERS.get(type(owner))
            if names is None:  # the class's containers, found once a process (vLLM sets them all in __init__)
                names = _CONTAINERS[type(owner)] = tuple(sorted(
                    name for name, value in vars(owner).items() if isinstance(value, (dict, set, frozenset, list))))
            for name in names:
                value = getattr(owner, name, None)
                if not value:  # the common case at a run's end: empty
                    continue
                if isinstance(value, (dict, set, frozenset)):
                    held = [k for k in value if isinstance(k, str) and k in ids]
                elif isinstance(value, list):
                    held = [e[0] for e in value if isinstance(e, tuple) and e and isinstance(e[0], str) and e[0] in ids]
                else:
                    continue
                left += [(f"{type(owner).__name__}.{name}", rid) for rid in sorted(set(held))]
        left += [("Scheduler.requests", rid) for rid in sorted(self.scheduler.requests) if rid in ids]
        return left

    def watch_frees(self, report: Callable[[str, int, int, int, str], None]) -> None:
        """Check a request's attention tables each time vLLM frees them, before the blocks go back
        (`KVCacheManager.free` and `pop_blocks_for_free`, the only ways vLLM 0.32 frees a request:
        finished, aborted or preempted, sched/scheduler.py:2766-2775, 3151): every block at column i
        of a group that is not mamba that carries a prefix-cache key carries the request's own hash
        for the tokens its key claims, with its group's id (`make_block_hash_with_group_id`), and that
        token count ends inside column i. `BlockPool.cache_full_blocks` keys block i by the hash at
        (i + 1) * block_size (block_pool.py:263-300; `resolve_block_hashes` takes the hash-unit hash at
        that boundary, kv_cache_utils.py:2690-2715), `cache_partial_block` a prompt tail inside its
        block by the hash at its boundary (block_pool.py:449-510), and a hit hands out the block found
        under the request's own hash (`get_cached_block`, 198-224; a partial hit is copied before the
        request writes, single_type_kv_cache_manager.py:393). Mamba groups are left to the state audit.
        `report(request, group, column, block id, what is wrong)` for each block that breaks it: no
        per-step cost, one pass over a request's tables per free. With prefix caching off: nothing."""
        manager = self.scheduler.kv_cache_manager
        groups = tuple(m for m in self._managers if not isinstance(m, MambaManager))
        if not groups or not self.block_pool.enable_caching:
            return
        unit = self.hash_block_size

        # (table map, block size, group id, the key suffix make_block_hash_with_group_id appends for the group)
        checked = tuple((m.req_to_blocks, m.block_size, m.kv_cache_group_id,
                         bytes(make_block_hash_with_group_id(b"", m.kv_cache_group_id))) for m in groups)

        def check(request) -> None:
            rid, hashes = request.request_id, request.block_hashes
            for tables, size, group, suffix in checked:
                table = tables.get(rid)
                if not table:
                    continue
                end = 0  # column * size, then (column + 1) * size
                for column, block in enumerate(table):
                    start, end = end, end + size
                    key = block.block_hash
                    if key is None:  # the null block never carries one
                        continue
                    tokens = block.block_hash_num_tokens
                    # the common case first: a key inside its column, on the hash grid, that is the request's own hash
                    if (tokens is not None and start < tokens <= end and not tokens % unit
                            and tokens // unit <= len(hashes) and key == hashes[tokens // unit - 1] + suffix):
                        continue
                    if tokens is None or not start < tokens <= end or tokens % unit:
                        what = f"a key for {tokens} tokens, not inside column {column} (tokens {start}..{end})"
                    elif tokens // unit > len(hashes):
                        what = f"a key for {tokens} tokens, past the request's {len(hashes) * unit} hashed tokens"
                    elif bytes(key[:-4]) == bytes(hashes[tokens // unit - 1]):
                        what = f"the request's hash for {tokens} tokens under another group's id"
                    else:
                        what = f"a key for {tokens} tokens that is not the request's hash of its first {tokens} tokens"
                    report(rid, group, column, block.block_id, what)

        free, pop = manager.free, manager.pop_blocks_for_free

        def checked_free(request, *args, **kwargs):
            check(request)
            return free(request, *args, **kwargs)

        def checked_pop(request, *args, **kwargs):
            check(request)
            return pop(request, *args, **kwargs)

        manager.free, manager.pop_blocks_for_free = checked_free, checked_pop

    def num_free_blocks(self) -> int:
        """The pool's free count, as vLLM reports it."""
        return self.block_pool.get_num_free_blocks()

    def holds_blocks(self, request_id: str) -> bool:
        """Whether the request holds a block in any KV-cache group (a table that is not empty)."""
        return any(m.req_to_blocks.get(request_id) for m in self._managers)

    def block_holders(self) -> list[str]:
        """The requests holding blocks in any KV-cache group (a table that is not empty), sorted."""
        holders: set[str] = set()
        for m in self._managers:
            for rid, blocks in m.req_to_blocks.items():
                if blocks:
                    holders.add(rid)
        return sorted(holders)

    def lone_holding(self) -> tuple[str, tuple[int, ...]] | None:
        """(the request, its blocks in each KV-cache group) when exactly one request holds blocks (a
        table that is not empty, in any group), else None: the capacity rule's case, read after every
        step (mambafuzz.sim.engine.pool_facts), so it stops at the second holder it meets. The null
        block is not counted: align mode nulls the state blocks it no longer needs in place
        (`remove_skipped_blocks`)."""
        sole = None
        for m in self._managers:
            for rid, blocks in m.req_to_blocks.items():
                if blocks and rid != sole:
                    if sole is not None:
                        return None
                    sole = rid
        if sole is None:
            return None
        held = []
        for m in self._managers:  # plain loops: the cheapest count of a short list (see walk_pool)
            tables = m.req_to_blocks.get(sole, ())
            count = len(tables)
            for block in tables:
                if block.is_null:
                    count -= 1
            held.append(count)
        return sole, tuple(held)

    def own_scratch(self, request_id: str, block_id: int) -> bool:
        """Whether `block_id` is a block `request_id` alone holds, unhashed, in its mamba tables: one a
        stale write of its own cannot harm anyone (BlockPool.is_block_writable, the condition
        MambaManager._relocate_speculative_block asserts before it moves a block to a later column)."""
        block = self.block_pool.blocks[block_id]
        if not self.block_pool.is_block_writable(block):
            return False
        return any(block in m.req_to_blocks.get(request_id, ()) for m in self._mamba_managers)

    @staticmethod
    def mamba_entry(key: bytes, block: KVCacheBlock) -> CachedMambaEntry:
        """One (key, block) pair of `cached_mamba_blocks`, described."""
        primary = block.block_hash == key
        # the key less its group id, its last 4 bytes (get_block_hash, as `cached_mamba_blocks` reads it)
        return tuple.__new__(CachedMambaEntry, (bytes(key[:-4]), block.block_id, primary,
                                                block.block_hash_num_tokens if primary else None))

    @staticmethod
    def spec_tokens(out: SchedulerOutput) -> Mapping[str, list[int]]:
        return out.scheduled_spec_decode_tokens

    @staticmethod
    def preempted(out: SchedulerOutput) -> AbstractSet[str]:
        """The requests `out` preempted; read-only (most steps preempt none: one shared empty set)."""
        ids = out.preempted_req_ids
        return set(ids) if ids else _NO_IDS

# (SchedulerOutput.kv_connector_block_state, v1/core/sched/output.py:215-228); before, no such field.
BOUNDARY_STATE_OFFLOADS = "kv_connector_block_state" in features.init_params(SchedulerOutput)
NO_BOUNDARY_STATE_OFFLOADS = (f"{VLLM} has no SchedulerOutput.kv_connector_block_state: it names no mamba block "
                              "for a connector to save, so the simulated connector saves nothing")


def boundary_state_offloads(out: SchedulerOutput) -> list[tuple[str, int, int, int]] | None:
    """This schedule's boundary-state hand-offs, (request, KV-cache group, block id, boundary tokens)
    in the scheduler's order; None on a vLLM without them. Read in the connector's
    `build_connector_meta`: the scheduler clears the field right after (scheduler.py:1547)."""
    if not BOUNDARY_STATE_OFFLOADS:
        return None
    state = out.kv_connector_block_state
    if state is None:
        return []
    return [(rid, group, block, tokens) for rid, entries in state.boundary_state_offloads.items()
            for group, block, tokens in entries]


def is_waiting_for_remote_kv(req: Request) -> bool:
    return req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
