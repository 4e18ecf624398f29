"""What one engine run recorded, step by step: the facts the oracles judge.

The harness only gathers facts (what vLLM scheduled, which block the kernel model read and
wrote, what the prefix cache claims); the oracles in `oracle.py` decide what is wrong.
The per-row records are NamedTuples: immutable, and the cheapest records Python builds
(the harness makes several per scheduled row).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import NamedTuple

from mambafuzz.sim.state import State


class Chunk(NamedTuple):
    request_id: str
    start: int  # num_computed_tokens when the step began
    num_tokens: int  # tokens scheduled, drafts included
    num_drafts: int
    read_column: int
    read_block: int
    read_state: State
    true_state: State  # the state of the request's own first `start` tokens
    first_after_admission: bool
    resumed_from_hit: bool  # start > 0 on the first chunk: a prefix or connector hit

    @property
    def end(self) -> int:
        return self.start + self.num_tokens - self.num_drafts


class SlotWrite(NamedTuple):
    request_id: str
    column: int
    block_id: int
    state: State
    cause: str  # "chunk-end", "spec-token", "precopy", "postcopy", "checkpoint", "cow", "connector", "zero"


class CacheEntry(NamedTuple):
    """One prefix-cache key on a mamba block, after the step's forward."""

    block_id: int
    column: int  # the block-table slot p that the claim corresponds to: cdiv(tokens, block) - 1
    claimed: State  # what the hash promises: the state after exactly these tokens
    held: State  # what the kernel model says the block holds
    claimed_by: str  # the request whose tokens define the hash
    new: bool  # first seen this step
    primary: bool
    recorded_tokens: int | None  # block_hash_num_tokens (primary keys)


class ResetRecord(NamedTuple):
    """One `reset_prefix_cache` call between engine steps (Scenario.prefix_cache_resets) and the cache
    around it, for the oracle (mambafuzz/checks/cache_reset.py)."""

    step: int  # taken before this step's schedule()
    reset_running_requests: bool
    succeeded: bool  # vLLM's answer
    preempted: tuple[str, ...]  # requests it preempted first
    keys_before: int  # prefix-cache keys (every group) before the call
    keys_after: int  # and after it
    keys_left: tuple[tuple[int, str], ...]  # a successful reset's: (block id, key hex) of each key still there
    hashed_left: tuple[int, ...]  # a successful reset's: blocks still carrying a hash
    unchanged: bool  # the keys after it are exactly the keys before it


class Admission(NamedTuple):
    request_id: str
    local_hit_tokens: int
    external_tokens: int
    external_async: bool


class _NoItems(list):
    """An empty list that refuses to change: `NO_ITEMS`, shared by every StepRecord field a step
    leaves empty. A step fills few of its lists (a run's arrivals, admissions, cache entries and
    finishes land on a tenth of its steps), and a fresh empty list per field and step was most of
    the objects a run kept alive, each bringing the next garbage collection closer. A writer that
    appends to a shared field fails here at once instead of filling every record."""

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("this StepRecord field is the shared NO_ITEMS: fill it with StepRecord.add")

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse  # type: ignore[assignment]


NO_ITEMS: list = _NoItems()


# Each StepRecord's factory for its NO_ITEMS fields (seven calls a step): a C-level callable that
# returns NO_ITEMS each time, without a Python frame per call.
_no_items = itertools.repeat(NO_ITEMS).__next__


@dataclass
class StepRecord:
    """One engine step. `chunks` and `writes` are the record's own lists (most steps run a row);
    the other list fields start as the shared, unchangeable NO_ITEMS (equal to, and printed as,
    an empty list) until `add` or an assignment gives them a list of their own. (The harness's
    records, built without the constructor, start with every field NO_ITEMS: see below.)"""

    step: int
    arrivals: list[str] = field(default_factory=_no_items)
    aborts: list[str] = field(default_factory=_no_items)
    admissions: list[Admission] = field(default_factory=_no_items)
    chunks: list[Chunk] = field(default_factory=list)
    writes: list[SlotWrite] = field(default_factory=list)
    cache: list[CacheEntry] = field(default_factory=_no_items)
    preempted: list[str] = field(default_factory=_no_items)
    finished: list[str] = field(default_factory=_no_items)
    recv_done: list[str] = field(default_factory=_no_items)

    def add(self, name: str, item: object) -> None:
        """Append `item` to the list field `name`, which gets a list of its own first if it is NO_ITEMS."""
        items = getattr(self, name)
        if items is NO_ITEMS:
            items = []
            setattr(self, name, items)
        items.append(item)


# A record built as `object.__new__(StepRecord)` with only `step` set (the harness's per-step record,
# built without the constructor's frame and nine stores) reads every list field from these class
# attributes: the shared NO_ITEMS, printed and compared as `[]`, until `add` or an assignment gives
# the field a list of its own. Only `step` is then in the instance's dict, so a copy or pickle keeps
# the same record.
for _name in ("arrivals", "aborts", "admissions", "chunks", "writes", "cache", "preempted", "finished", "recv_done"):
    setattr(StepRecord, _name, NO_ITEMS)


@dataclass
class BatchEvent:
    """What the engine core's batch queue did in one step (async scheduling only): the batch it
    scheduled (and whose forward the kernel model ran), the blocks schedule() published for it,
    the batch whose output it applied, and the blocks update_from_output published then. A block
    published at schedule time is written by a forward that, on a GPU, is still in flight."""

    scheduled: int | None = None
    published: tuple[int, ...] = ()
    applied: int | None = None
    published_on_update: tuple[int, ...] = ()
    in_flight: int = 0  # batches in the queue after this step's schedule()


@dataclass
class Crash:
    """An exception raised inside vLLM while the harness drove it."""

    exc_type: str
    message: str
    vllm_frame: str  # "path/in/vllm.py:line in function", the innermost vLLM frame
    step: int
    contract: str = field(default="", repr=False)  # the rule a SchedulerContract crash broke (repr: digests stay)


@dataclass
class Trace:
    split: str
    prefix_caching: bool
    steps: list[StepRecord] = field(default_factory=list)
    outputs: dict[str, list[int]] = field(default_factory=dict)
    finish_status: dict[str, str] = field(default_factory=dict)
    unfinished: list[str] = field(default_factory=list)
    step_bound: int = 0
    hit_bound: bool = False
    # the first of the quiet steps after which the run stopped before its bound: the scheduler had reached a fixed
    # point (harness.IDLE_STEPS_TO_STALL quiet steps: nothing scheduled, in flight or due); None otherwise
    stopped_idle_at: int | None = None
    timed_out: bool = False  # the wall-clock bound, not the step bound, ended the run
    crash: Crash | None = None
    # the engine facts the oracle's signatures need
    mamba_block_size: int = 0
    runner: str = ""  # the vLLM model runner the kernel model mirrored (a name in mambafuzz.model.runners)
    async_scheduling: bool = False  # vLLM's AsyncScheduler under a batch queue, else Scheduler
    batch_queue_depth: int = 1  # batches the engine core keeps in flight
    batches: dict[int, BatchEvent] = field(default_factory=dict)  # step -> its batch-queue events (async)
    in_flight_aborts: set[tuple[int, str]] = field(default_factory=set)  # (step, request) taken before an update
    mixer: str = ""  # the mixer family ("gdn" | "mamba2")
    # (step, mamba group position >= 1, its chunk) for each row a mamba group other than the first started
    # from a wrong state (the first group's rows are the steps' chunks); not part of the trace digest
    mamba_group_reads: list[tuple[int, int, Chunk]] = field(default_factory=list)
    model: str = ""  # engine.model and vLLM's KV-cache groups for it (mambafuzz.sim.bridge.architectures.describe)
    spec_rows: set[tuple[int, str]] = field(default_factory=set)  # (step, request) run on the spec kernel
    # (step, request) of the first row after V1 reset the request's accepted-token count
    after_accepted_reset: set[tuple[int, str]] = field(default_factory=set)
    internal_checkpoints: bool = False  # the mamba spec exports internal prefill checkpoints
    # what can end a chunk, for the oracle's mechanism (mambafuzz/checks/oracle.py `mechanism`)
    prompt_lens: dict[str, int] = field(default_factory=dict)
    # continuations that arrived: request -> (the request it continues, generated tokens it took, its prompt's fingerprint)
    continuations: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    token_budget: int = 0  # max_num_batched_tokens
    long_prefill_threshold: int = 0  # long_prefill_token_threshold (0: off)
    # efficiency counters, for the differential against a reference split
    forward_steps: int = 0
    hashed_snapshots: int = 0
    prefix_hit_tokens: int = 0
    # resource facts, for the resource oracles (mambafuzz/checks/resources.py); none is in the trace digest
    prompts: dict[str, tuple[int, ...]] = field(default_factory=dict)  # request -> its prompt's tokens
    external_requests: set[str] = field(default_factory=set)  # requests the connector plans to claim tokens for
    hit_alignment: int = 0  # the grid a hit and a prompt's checkpoint align to (cache_hit_alignment_tokens)
    eagle_block_drop: bool = False  # the scheduler drops a hit's last block for an EAGLE/MTP drafter
    lru_evictions: dict[int, int] | None = None  # step -> cached blocks evicted to hand them out (None: not counted)
    num_blocks: int = 0  # the pool's blocks, the null block included
    startup_min_blocks: int = 0  # the smallest pool vLLM's start-up check accepts for this config
    group_reserves: tuple[int, ...] = ()  # blocks the check reserves per KV-cache group for one request
    group_kinds: tuple[str, ...] = ()  # "mamba" or the group's spec class, per KV-cache group
    group_block_sizes: tuple[int, ...] = ()  # each KV-cache group's block size
    # (step, free count the pool reports, unreferenced blocks, blocks with a negative count) after each step that
    # moved the free count (pools over harness.POOL_WALK_EVERY_STEP blocks: none), every 8th step, and at the end
    # of a run that ended
    pool: list[tuple[int, int, int, int]] = field(default_factory=list)
    # step -> (block id, its reference count, its entries in request tables, in deferred frees): at the pool's
    # walks, the first block whose count is not its holders' (SchedulerSession.walk_pool)
    ref_mismatches: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    # (step, request, blocks vLLM's allocate_slots estimated, blocks it took) where it took more
    # (SchedulerSession._watch_estimates)
    over_estimates: list[tuple[int, str, int, int]] = field(default_factory=list)
    # (step, the one request holding blocks after the step, its blocks per group); steps where its tables hold
    # every block in use only (no other request's, none vLLM holds back as a deferred free)
    alone: list[tuple[int, str, tuple[int, ...]]] = field(default_factory=list)
    # (step, request, attention KV-cache group, column, block, tokens its key claims, whether K/V of any prefix
    # ever completed it): a prefix-cache hit served a full attention block that does not hold the K/V of the
    # request's prefix up to its end (mambafuzz.sim.engine.attention_kv.AttentionBlocks)
    attention_stale_hits: list[tuple[int, str, int, int, int, int, bool]] = field(default_factory=list)
    # requests still holding blocks when the run ended with nothing left to do (the pool is quiescent)
    held_at_end: list[str] = field(default_factory=list)
    # (where, request) for each entry a freed request left in the KV-cache manager's per-request state, read when
    # the run ended with nothing left to do (SchedulerSession.request_state_left)
    request_state_at_end: list[tuple[str, str]] = field(default_factory=list)
    # (step, request, KV-cache group, column, block id, what is wrong) for each cached attention block whose key is
    # not its request's hash at its position, seen as vLLM freed the request (SchedulerSession.watch_frees)
    attention_keys: list[tuple[int, str, int, int, int, str]] = field(default_factory=list)
    peak_blocks: int = 0  # the most blocks in use (not free, the null block not counted) after any step
    # the KV connector's work beyond one-step loads (EngineConfig.connector_* knobs), in order:
    # (step, "save" | "sent" | "recv-done" | "load-fail", request, detail)
    connector_events: list[tuple[int, str, str, str]] = field(default_factory=list)
    resets: list[ResetRecord] = field(default_factory=list)  # the engine's reset_prefix_cache calls, in order

    def resource_figures(self) -> dict[str, int]:
        """The figures PR mode's efficiency gate compares with the base's (mambafuzz.search.pr.efficiency_gate)."""
        return {"hits": self.prefix_hit_tokens, "steps": self.forward_steps, "blocks": self.peak_blocks}
