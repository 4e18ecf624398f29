"""Drive one scenario through vLLM's real Scheduler and KV-cache manager, with the kernel
model standing in for the GPU, and record a Trace.

scenario -> (this module) -> trace -> oracle.  The harness judges nothing itself.  It plays
the engine core and the model runner: StepPlan says what arrives and is aborted when,
mambafuzz.sim.worker.worker_mirror applies each SchedulerOutput to the kernel model as the worker would (the
runtime audit plugin applies it through the same code), and mambafuzz.sim.engine.cache_audit describes every
published mamba block; this module turns their results into the trace and answers the
scheduler with greedy tokens and drafts.
"""

from __future__ import annotations

import _signal
import os
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mambafuzz.exit_codes import ToolError, one_line
from mambafuzz.model.scenario import VOCAB_SIZE, Scenario, ScenarioError, ample_pool_blocks
from mambafuzz.model.step_plan import BOUND, StepPlan
from mambafuzz.sim.bridge import configs, scheduler_session
from mambafuzz.sim.bridge.vllm_compat import VllmUnsupported
from mambafuzz.sim.engine.cache_audit import BlockAuditor
from mambafuzz.sim.engine.connector import scripted_hits
from mambafuzz.sim.engine.engine_core import Batch, BatchQueue
from mambafuzz.sim.engine.hash_book import HashBook
from mambafuzz.sim.state import PrefixStates, next_token
from mambafuzz.sim.trace import Admission, BatchEvent, Chunk, Crash, SlotWrite, StepRecord, Trace
from mambafuzz.sim.worker.kernel_model import KernelGeometry, KernelModel
from mambafuzz.sim.worker.worker_mirror import WorkerMirror, accepted_count, extend_truth
from mambafuzz.sim.worker.worker_tables import UntoldRequest, WorkerTables


@dataclass
class _Live:
    """The harness's view of one request: its true token history and its truth."""

    index: int
    truth: PrefixStates
    req: Any  # vLLM's Request (the session keeps it after vLLM drops it)
    first_chunk_pending: bool = False
    prefill_len: int = 0  # tokens at the last (re)admission: V2's `prefill_len`
    # Tokens the worker holds for the request: the scheduler's count at (re)admission (V1
    # `_update_states` recovers a resumed request's outputs from `all_token_ids`; V2 re-adds it
    # whole), then each forward's sampled tokens. Under async scheduling it runs ahead of vLLM's
    # Request, which learns a batch's tokens only when the engine core applies its output.
    known: int = 0
    # Async scheduling: the drafts the worker's drafter proposed after the request's last row. The
    # scheduler schedules `-1` placeholders (AsyncScheduler._update_after_schedule) and the worker
    # feeds its own proposals in their place.
    drafts: list[int] = field(default_factory=list)


def vllm_frame(exc: BaseException) -> str:
    """Where in vLLM `exc` was raised: its innermost vLLM frame ("outside-vllm" when none);
    the harness and the engine replay locate a crash by it."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/vllm/" in f.filename]
    if not frames:
        return "outside-vllm"
    f = frames[-1]
    path = f.filename[f.filename.rfind("/vllm/") + 1 :]
    return f"{path}:{f.lineno} in {f.name}"


class SchedulerContractError(Exception):
    """vLLM's SchedulerOutput asks the worker for something no worker can run. A finding located
    at the scheduler's output, with the broken rule (`contract`) as its mechanism, not a tool
    failure: a GPU worker would run it on garbage. Checked before the harness uses the state."""

    location = "scheduler-output"

    def __init__(self, contract: str, message: str):
        super().__init__(message)
        self.contract = contract

    def crash(self, step: int) -> Crash:
        return Crash("SchedulerContract", str(self), self.location, step, self.contract)


SCHEDULER_OUTPUT = SchedulerContractError.location
STALE_OUTPUT_CHANGES_NOTHING = "stale-output-changes-nothing"  # the rule a StaleDeliveryError breaks


class StaleDeliveryError(SchedulerContractError):
    """update_from_output applied a batch's output to a request preempted after that batch was
    scheduled, and moved its counters: the stale share must change nothing (AsyncScheduler
    `_update_request_with_output(is_stale=True)`, Scheduler.update_from_output's stale branch)."""

    location = "stale-delivery"


# vLLM's contract for one scheduled row, each rule by name (the finding's mechanism):
ROW_WITHIN_TOKENS = "row-within-tokens"  # the row covers tokens its request has
ROW_VERIFIES_DRAFTS = "row-verifies-drafts"  # drafts follow at least one real token, whose output checks the first
ROW_STATE_IN_TABLE = "row-state-in-table"  # the mamba block table holds the block the row's state goes to
ROW_COUNTS_ARE_INTEGERS = "row-counts-are-integers"  # token counts and positions are ints, as the worker indexes with them
# A boundary-state hand-off names a boundary on the hash grid: Mooncake's store worker asserts it
# (mooncake/store/worker.py:594-598, `_boundary_puts`) before keying the block by that prefix's hash.
OFFLOAD_ON_HASH_GRID = "offload-on-hash-grid"
# schedule() hands the engine core a SchedulerOutput (EngineCore.step passes it to the executor as is)
SCHEDULE_RETURNS_OUTPUT = "schedule-returns-output"
# A row uses the blocks SchedulerOutput told the worker (worker_tables.WorkerTables). Where the manager's table
# holds a different real block at a column the row reads or writes, the scheduler changed a running request's
# table without telling (vLLM's worker only appends: `_update_states`, gpu_model_runner.py:1417-1428). The
# manager may null a block without telling: align mode nulls skipped states in place (`remove_skipped_blocks`)
# and moves scratch blocks to a later column (`_relocate_speculative_block`, single_type_kv_cache_manager.py:
# 1908-1917, asserting the block is the request's alone and unhashed). A row that writes through such a stale
# column breaks the rule only when the block is no longer the request's own scratch (free, shared, cached or
# another's); a read through it is judged by the state oracles, as the kernel model reads the told block.
ROW_BLOCKS_AS_TOLD = "row-blocks-as-told"


def check_told_blocks(rid: str, told: Sequence[list[int]], held: Sequence[Sequence[Any]], read_column: int,
                      writes: Sequence[tuple], rest_reads: Sequence[Any], null_block: int,
                      own_scratch: Any) -> None:
    """Raise SchedulerContractError when a column a row read (`read_column`, each other group's in
    `rest_reads`) or wrote (the first two fields of each of `writes`: column, block) holds another
    block in the worker's table (`told`) than in the manager's (`held`: each group's KVCacheBlock
    list, vLLM's own: `SchedulerSession.mamba_block_lists`), by ROW_BLOCKS_AS_TOLD's rule.
    `own_scratch(rid, block)` says whether the request alone holds the block, unhashed. It runs
    per row, so it reads the few columns a row uses in place: align mode nulls skipped blocks in
    the manager's table only, and the two tables differ on most rows."""
    columns = {read_column}
    for write in writes:
        columns.add(write[0])
    for read in rest_reads:
        columns.add(read.read_column)
    if len(columns) > 1:
        columns = sorted(columns)
    for g, (worker, manager) in enumerate(zip(told, held)):
        nw, nm = len(worker), len(manager)
        for c in columns:
            if c < 0:
                continue
            w = worker[c] if c < nw else None
            m = manager[c].block_id if c < nm else None
            if w == m:
                continue
            written = any(x[0] == c for x in writes)
            if m == null_block and w is not None:
                if not written or own_scratch(rid, w):
                    continue
                why = "which the scheduler nulled there and no longer holds as the request's own scratch block"
            else:
                why = "but the scheduler's table holds " + ("no block" if m is None else f"block {m}")
            raise SchedulerContractError(ROW_BLOCKS_AS_TOLD, (
                f"{rid}'s row {'writes' if written else 'reads'} mamba block-table column {c} (group {g}): "
                f"the worker was told block {w} (SchedulerOutput), {why}"))


def check_row(rid: str, start: int, num_tokens: int, num_drafts: int, request_tokens: int,
              table: list[int], block_size: int | None) -> None:
    """Raise SchedulerContractError when a row breaks vLLM's contract with its worker, before
    the harness uses the row. A negative count fails the first rule. A row of drafts alone (a
    rollback that left too many tokens computed) made the harness index past the row's outputs,
    and a table without the row's state block (column cdiv(start + num_tokens, block_size) - 1 in
    align mode, 0 with `block_size` None: no prefix caching) past the table: tool failures on a
    vLLM bug.  So did a token count that is not an int (a `/` for a `//` in the split): the worker
    slices its inputs with it."""
    if type(start) is not int or type(num_tokens) is not int:
        raise SchedulerContractError(ROW_COUNTS_ARE_INTEGERS, f"{rid} is scheduled for {num_tokens!r} token(s) from "
                                     f"position {start!r}: the worker indexes its inputs with both")
    end = start + num_tokens - num_drafts
    if not 0 <= start <= end <= request_tokens:
        raise SchedulerContractError(ROW_WITHIN_TOKENS, f"{rid} is scheduled for tokens {start}..{end} "
                                     f"(+{num_drafts} drafts) but has {request_tokens} tokens")
    if num_drafts and start == end:
        raise SchedulerContractError(ROW_VERIFIES_DRAFTS, f"{rid} is scheduled for {num_drafts} draft(s) at token "
                                     f"{start} and no token of its own to verify them with")
    column = -(-(start + num_tokens) // block_size) - 1 if block_size else 0
    if column >= len(table):
        raise SchedulerContractError(ROW_STATE_IN_TABLE, f"{rid} is scheduled up to token {start + num_tokens} (state "
                                     f"block column {column}) but its mamba block table has {len(table)} block(s)")


class HarnessError(ToolError):
    """mambafuzz's own simulation raised, with no vLLM frame on the stack: a tool failure, never a
    `vllm_crash` finding.  (It may still point at a vLLM inconsistency, e.g. a block table too
    short for the tokens scheduled; the input is kept so a person can tell.)"""


def _crash_or_tool_error(exc: Exception, step: int) -> Crash:
    """A vLLM crash located by vLLM's innermost frame; our own exception is a HarnessError."""
    where = vllm_frame(exc)
    if where == "outside-vllm":
        raise HarnessError(f"the harness itself raised {one_line(exc, where=True)} (step {step}); "
                           "a tool failure, not a vLLM crash") from exc
    return Crash(type(exc).__name__, (str(exc).splitlines() or [""])[0], where, step)


_tuple_new = tuple.__new__
_new = object.__new__

POOL_WALK_EVERY_STEP = 4096  # blocks: the largest pool whose accounting is walked after every step
DEFAULT_TIMEOUT = float(os.environ.get("MAMBAFUZZ_SCENARIO_TIMEOUT", "60"))


class _WallClockExceeded(Exception):
    pass


def _on_alarm(signum, frame):
    raise _WallClockExceeded()


def run(scenario: Scenario, split: scheduler_session.SplitFn | None = None, split_name: str = "fixed",
        prefix_caching: bool = True, timeout: float | None = None) -> Trace:
    """Run `scenario` once; `split` replaces Scheduler._mamba_block_aligned_split if given.

    Bounded twice: by the scenario's step bound (liveness) and by a wall-clock `timeout`
    (checked every step, with a SIGALRM backstop for a hang inside one vLLM call)."""
    engine = scenario.engine
    if not prefix_caching:
        engine = engine.without_prefix_caching()
    num_blocks = engine.num_gpu_blocks or ample_pool_blocks(scenario)
    plan = StepPlan.of(scenario)
    trace = Trace(split=split_name, prefix_caching=prefix_caching, step_bound=plan.bound,
                  mixer=scenario.engine.mixer,
                  mamba_block_size=engine.mamba_block_size,
                  internal_checkpoints=engine.enable_prefix_caching and engine.num_prefill_checkpoint_blocks > 0,
                  prompt_lens={rid: scenario.prompt_len(i) for i, rid in enumerate(plan.ids)},
                  token_budget=engine.max_num_batched_tokens,
                  long_prefill_threshold=engine.long_prefill_token_threshold)
    try:
        session = scheduler_session.SchedulerSession(engine, num_blocks, scenario.max_model_len(), split, scenario.uses_connector)
    except configs.ConfigRejected as exc:
        raise ScenarioError([str(exc)]) from None
    except VllmUnsupported:
        raise
    except Exception as exc:  # vLLM failed to build a scheduler for a config it accepted
        trace.crash = _crash_or_tool_error(exc, -1)
        return trace
    trace.runner = session.runner
    trace.num_blocks, trace.startup_min_blocks = num_blocks, session.startup_min_blocks
    trace.group_reserves, trace.group_kinds = session.group_reserves, session.group_kinds
    trace.group_block_sizes = session.group_block_sizes
    trace.hit_alignment = session.cache_hit_alignment_tokens
    trace.eagle_block_drop = bool(getattr(session.scheduler, "use_eagle_block_drop", False))
    trace.lru_evictions = None if session.lru_evictions is None else {}
    trace.external_requests = {rid for rid, r in zip(plan.ids, scenario.requests) if r.external_tokens}
    trace.model = session.model_description
    trace.async_scheduling, trace.batch_queue_depth = session.async_scheduling, session.batch_queue_depth
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    runner = _Runner(scenario, plan, session, trace, prefix_caching, time.monotonic() + timeout)
    use_alarm = timeout > 0 and threading.current_thread() is threading.main_thread()
    if use_alarm:
        # `_signal` is the C module under `signal`: the same calls, without the enum conversions
        # (they cost more than the rest of a run's set-up).
        previous = _signal.signal(_signal.SIGALRM, _on_alarm)
        _signal.setitimer(_signal.ITIMER_REAL, timeout + 5)
    try:
        runner.run()
    except _WallClockExceeded:
        trace.timed_out = True
    finally:
        if use_alarm:
            _signal.setitimer(_signal.ITIMER_REAL, 0)
            _signal.signal(_signal.SIGALRM, previous)
    return trace


class _Runner:
    def __init__(self, scenario: Scenario, plan: StepPlan, session: scheduler_session.SchedulerSession, trace: Trace,
                 prefix_caching: bool, deadline: float = float("inf")):
        self.deadline = deadline
        self.s = scenario
        self.session = session
        self.trace = trace
        self.prefix_caching = prefix_caching
        self.ids = plan.ids
        self.live: dict[str, _Live] = {}
        e = scenario.engine
        sched = session.scheduler
        self.spec = e.uses_spec_decode
        geometry = KernelGeometry(
            block_size=e.mamba_block_size,
            hash_block_size=session.hash_block_size,
            checkpoint_alignment=e.prefill_checkpoint_alignment if (prefix_caching and e.num_prefill_checkpoint_blocks) else None,
            cache_hit_alignment_tokens=session.cache_hit_alignment_tokens,
            drop_eagle_block=bool(getattr(sched, "use_eagle_block_drop", False)),
            null_block_id=session.null_block_id,
            vocab_size=VOCAB_SIZE,
            spec_engine=self.spec,
            num_speculative_tokens=e.num_speculative_tokens,
            align=prefix_caching,
        )
        # One kernel model per mamba KV-cache group: all groups' layers share the pool's blocks, so each
        # group's table is mirrored; the first group's rows and writes are the trace's (mamba_group_reads
        # keeps the other groups' wrong reads).
        # With prefix caching off (the differential's reference run) the first group alone: nothing is
        # shared or published there, and the reference is read from the first group's rows anyway.
        groups = session.mamba_groups if prefix_caching else session.mamba_groups[:1]
        models = [KernelModel(geometry, runner=session.runner, mixer=scenario.engine.mixer,
                              first_use=(session.allocated_blocks, session.reused_blocks))
                  for _ in groups]
        # The kernel models run on the tables the worker was told (WorkerTables, from each SchedulerOutput);
        # the manager's own tables are read only to hold the blocks a row uses against them (`_held_blocks`,
        # vLLM's lists) and to load a request the worker holds no table for yet (`_held`, their ids)
        self._held = session.mamba_tables if len(models) > 1 else lambda rid: (session.mamba_block_ids(rid),)
        self._held_blocks = (session.mamba_block_lists if len(models) > 1 else
                             lambda rid: (session.mamba_blocks(rid),))
        self.told = WorkerTables(groups, session.runner)
        self._groups = groups
        self._null = session.null_block_id
        self.model = models[0]
        self.mirror = WorkerMirror(models, self.spec)
        self.plan = plan
        self.book = HashBook(session.hash_block_size)
        self.auditor = BlockAuditor(self.book, self.model, e.mamba_block_size)
        # live requests not admitted yet, or preempted since: the only ones an admission can be
        self.unadmitted: set[str] = set()
        self.known_entries: set[tuple[bytes, int]] = set()
        # the last full scan of the cache's mamba keys, and the key-map version it saw
        self._scanned: list = []
        self._scanned_blocks: set[int] = set()
        self._scanned_version = -1
        self.accepted_reset: set[str] = set()  # V1 forgot their accepted count; not scheduled since
        self.async_mode = session.async_scheduling
        self.queue = BatchQueue(session.batch_queue_depth)  # the engine core's batches in flight
        self._in_flight_step = -1
        self._step: tuple = ()  # (record, batch event, admissible requests) of the step running
        self._state_block_size = e.mamba_block_size if prefix_caching else None  # check_row's grid
        self.in_flight_aborts: list[str] = []  # delivered by the aborts queue at the next update
        self._walked_free: int | None = None  # the free count at the pool's last walk (`_pool_facts`)
        self._inserted = session.inserted_blocks  # the mamba blocks keyed since it was last cleared
        if self.async_mode:
            session.cache_keys_version()  # install the key watch before the first schedule()
        self.connector = session.connector if prefix_caching else None  # it sees nothing without prefix caching
        # connector work in progress (EngineConfig.connector_* knobs): async loads not finished yet
        # (request -> [forwards left, order, fails]) and saves not sent yet (request -> [updates
        # left, the entries it saves]); both empty under the default knobs
        self.recv_pending: dict[str, list] = {}
        self.send_pending: dict[str, list] = {}
        self._async_loads = 0
        self.save_entries: dict[str, dict] = {}  # request -> block hash -> [tokens, a state per mamba group]: not sent yet
        self.recv_tracked = bool(e.connector_recv_steps or e.connector_failed_load)
        if self.connector is not None:
            self.connector.plan = scripted_hits(scenario, self.ids)
            c = self.connector
            c.save_requests, c.load_saved = e.connector_save, e.connector_load_source == "saved"
            c.mamba_block_size, c.hash_block_size = e.mamba_block_size, session.hash_block_size
            c.divergent_hits = e.connector_divergent_hits

    # ---- main loop -------------------------------------------------------------------
    def run(self) -> None:
        step = 0
        try:
            while True:
                end = self.plan.end(step, self.session.has_unfinished() or bool(self.queue)
                                    or bool(self.send_pending) or bool(self.recv_pending))
                if end is not None:
                    self.trace.hit_bound = end == BOUND
                    break
                if time.monotonic() > self.deadline:
                    self.trace.timed_out = True
                    break
                self._engine_step(step)
                step += 1
        except _WallClockExceeded:
            self.trace.timed_out = True
        except VllmUnsupported:
            raise
        except SchedulerContractError as exc:
            self.trace.crash = exc.crash(step)
        except scheduler_session.NoSchedulerOutput as exc:
            self.trace.crash = SchedulerContractError(SCHEDULE_RETURNS_OUTPUT, str(exc)).crash(step)
        except Exception as exc:
            self.trace.crash = _crash_or_tool_error(exc, step)
        if self.prefix_caching and self.trace.crash is None and not self.trace.timed_out:
            self._check_audit_view()
        if self.trace.crash is None and not self.trace.timed_out and not self.trace.hit_bound:
            self.trace.held_at_end = self.session.block_holders()
            if self.trace.steps and (not self.trace.pool or self.trace.pool[-1][0] != len(self.trace.steps) - 1):
                self._walk_pool(len(self.trace.steps) - 1)
        for rid in self.ids:
            req = self.session.request(rid)
            if rid in self.live:  # what vLLM's Request kept: a worker may run past a stop under async
                self.trace.outputs[rid] = self.live[rid].truth.tokens[req.num_prompt_tokens:req.num_tokens]
            if req is not None and not req.is_finished():
                self.trace.unfinished.append(rid)

    def _engine_step(self, step: int) -> None:
        """One engine-core step (mambafuzz.sim.engine.engine_core.BatchQueue): take the input queue, then
        `EngineCore.step` (schedule, forward, apply) or, under async scheduling,
        `EngineCore.step_with_batch_queue` (schedule and start the forward while the queue has
        room, else apply the oldest batch's output)."""
        # A record of empty lists without the constructor (trace.py: the list fields read the class's
        # NO_ITEMS until given their own); `_on_forward` gives it chunk and write lists when rows run.
        rec = _new(StepRecord)
        rec.step = step
        self.trace.steps.append(rec)
        self._take_input(rec, step)
        event = None
        if self.async_mode:
            # every field but the queue's size at its class default (BatchEvent's own defaults)
            event = self.trace.batches[step] = _new(BatchEvent)
            event.in_flight = len(self.queue.in_flight)
            if self._inserted:  # `take_inserted`, inline: blocks keyed before this step are no step's
                self._inserted.clear()
        waiting = sorted(rid for rid in self.unadmitted if self._running(rid)) if self.unadmitted else ()
        self._step = (rec, event, waiting)  # what the queue's callbacks work on
        self.queue.step(self.session, self._on_forward, self._on_apply)
        if self.plan.in_flight_aborts_at:
            self._take_in_flight_aborts(step)  # a step that ran no batch: they wait for the next input
        if self.prefix_caching:
            self._audit_cache(rec)
        self._pool_facts(step)

    def _pool_facts(self, step: int) -> None:
        """The step's resource facts: the pool's accounting, the blocks in use, LRU evictions, and
        the blocks of a request that holds blocks alone (the capacity vLLM promised at start-up)."""
        session, trace = self.session, self.trace
        # The pool's accounting walks every block: every 8th step, at the end of a run (`run`), and, on pools of
        # up to POOL_WALK_EVERY_STEP blocks (the generators' pools, mostly), after each step that moved the free
        # count. Most steps leave it as it was (85% of generated ones: decodes inside a block). A fault in the
        # counts stays until a block is taken or freed again (an unqueued zero count, a negative one, a queue
        # counter off), so the next walk sees it, at most 7 steps later; one that a later step undoes while the
        # free count stands still is not seen.
        free = session.num_free_blocks()
        if not step % 8 or (free != self._walked_free and trace.num_blocks <= POOL_WALK_EVERY_STEP):
            free = self._walked_free = self._walk_pool(step)
        used = trace.num_blocks - 1 - free  # the null block is never free, and holds nothing
        if used > trace.peak_blocks:
            trace.peak_blocks = used
        if session.over_estimates:  # allocations that took more blocks than vLLM checked for
            trace.over_estimates += [(step, *o) for o in session.over_estimates]
            session.over_estimates.clear()
        evictions = session.lru_evictions
        if evictions is not None and evictions[0]:
            trace.lru_evictions[step] = evictions[0]
            evictions[0] = 0
        sole = session.sole_holder()
        if sole is not None:
            # alone only when its tables hold every block in use: blocks vLLM holds back for a freed request
            # (`Scheduler.deferred_frees`, with a consumer connector and batches in flight) belong to no table
            held = session.held_blocks(sole)
            if sum(held) == used:
                trace.alone.append((step, sole, held))

    def _walk_pool(self, step: int) -> int:
        """Record the pool's accounting after `step` (`SchedulerSession.walk_pool`); returns its free count."""
        counts, mismatch = self.session.walk_pool()
        self.trace.pool.append((step, *counts))
        if mismatch is not None:
            self.trace.ref_mismatches[step] = mismatch
        return counts[0]

    def _on_forward(self, batch: Batch) -> None:
        rec, event, waiting = self._step
        if event is not None:
            inserted = self._inserted  # `take_inserted`, inline: the blocks schedule() keyed
            event.scheduled = batch.index
            if inserted:
                event.published = tuple(inserted)
                inserted.clear()
        if batch.out.num_scheduled_tokens:  # each row appends its chunk and writes (_run_row)
            rec.chunks, rec.writes = [], []
        self._forward(rec, batch, waiting)
        if self.plan.in_flight_aborts_at:
            self._take_in_flight_aborts(rec.step)
        if event is not None:
            event.in_flight = len(self.queue.in_flight) + 1

    def _on_apply(self, batch: Batch) -> None:
        rec, event, _ = self._step
        if self.plan.in_flight_aborts_at:
            self._take_in_flight_aborts(rec.step)
        inserted = self._inserted
        if event is not None and inserted:  # `take_inserted`, inline: keyed before the update
            inserted.clear()
        self._apply(rec, batch)
        if event is not None:
            event.applied = batch.index
            if inserted:  # the blocks update_from_output keyed
                event.published_on_update = tuple(inserted)
                inserted.clear()

    def _take_in_flight_aborts(self, step: int) -> None:
        """Aborts that arrive while `step`'s batch executes join the aborts queue (once a step)."""
        if self._in_flight_step != step:
            self._in_flight_step = step
            self.in_flight_aborts += self.plan.in_flight_aborts(step, self._running)

    def _take_input(self, rec: StepRecord, step: int) -> None:
        """What the engine core's input queue delivers before a step: arrivals, then aborts."""
        session = self.session
        for i, rid in self.plan.arrivals(step) if step in self.plan.arrivals_at else ():
            r = self.s.requests[i]
            truth = PrefixStates.for_prompt(self.s.prompt_key(i), lambda: self.s.prompt_tokens(i))  # noqa: B023
            session.add_request(rid, truth.tokens, r.max_tokens, float(step))  # vLLM gets a copy
            self.live[rid] = _Live(i, truth, session.request(rid))
            self.unadmitted.add(rid)
            rec.add("arrivals", rid)
            self.trace.prompts[rid] = tuple(truth.tokens)
            if self.async_mode and self.prefix_caching:
                # schedule() may publish the prompt's blocks before any output of this request is
                # applied (the audit's book otherwise learns hashes after update_from_output)
                self.book.learn(rid, session.request(rid).block_hashes, truth)
        if self.plan.pending:
            self._take_continuations(rec, step)
        if self.plan.aborts_at or self.in_flight_aborts:  # most runs abort nothing: no list a step
            aborts = self.plan.aborts(step, self._running) if self.plan.aborts_at else []
            if self.in_flight_aborts:  # arrived during the last step's batch, which applied no output
                aborts += [rid for rid in self._drain_in_flight_aborts() if rid not in aborts]
            if aborts:
                self._abort(rec, aborts)

    def _take_continuations(self, rec: StepRecord, step: int) -> None:
        """Continuations due at `step` whose earlier request ended: each prompt is the earlier
        request's prompt plus the tokens the model really generated for it in this run (vLLM's
        Request holds them: a worker running ahead under async is cut back to them), then its tail."""
        session = self.session
        for i, j, rid in self.plan.continuations(step, self._ended):
            earlier = self.live[self.ids[j]]
            r = self.s.requests[i]
            tokens = extend_truth(earlier.truth, earlier.req).tokens[:earlier.req.num_tokens]
            prompt, n = self.s.continuation_prompt(i, tokens, earlier.req.num_prompt_tokens)
            truth = PrefixStates(prompt)
            session.add_request(rid, truth.tokens, r.max_tokens, float(step))  # vLLM gets a copy
            self.live[rid] = _Live(i, truth, session.request(rid))
            self.unadmitted.add(rid)
            rec.add("arrivals", rid)
            self.trace.continuations[rid] = (self.ids[j], n, truth.at(len(prompt)).fingerprint)
            self.trace.prompt_lens[rid] = len(prompt)
            self.trace.prompts[rid] = tuple(prompt)
            if self.async_mode and self.prefix_caching:
                self.book.learn(rid, session.request(rid).block_hashes, truth)

    def _ended(self, rid: str) -> bool:
        """Arrived, and finished or aborted."""
        live = self.live.get(rid)
        return live is not None and live.req.is_finished()

    def _drain_in_flight_aborts(self) -> list[str]:
        """The aborts queue's requests that are still running; the queue is empty after."""
        if not self.in_flight_aborts:
            return []
        aborts = [rid for rid in self.in_flight_aborts if self._running(rid)]
        self.in_flight_aborts = []
        return aborts

    def _abort(self, rec: StepRecord, aborts: list[str]) -> None:
        self.session.abort(aborts)
        if self.connector is not None and self.connector.saves:
            self._drain_saves(rec)
        rec.aborts = rec.aborts + aborts if rec.aborts else aborts
        for rid in aborts:
            self.trace.finish_status[rid] = "FINISHED_ABORTED"

    def _forward(self, rec: StepRecord, batch: Batch, waiting_before: Sequence[str]) -> None:
        """The worker's forward of a batch vLLM just scheduled, on the kernel model; `waiting_before`
        are the requests that could be admitted by that schedule()."""
        session = self.session
        out = batch.out
        connector_orders = self.connector.take_orders() if self.connector is not None else {}

        mirror = self.mirror
        for dst, state in mirror.before_forward(out):
            rec.add("writes", SlotWrite("-", -1, dst, state, "cow"))
        try:
            self.told.update(out)
        except UntoldRequest as exc:
            raise SchedulerContractError(ROW_BLOCKS_AS_TOLD, str(exc)) from None
        preempted = session.preempted(out)
        if preempted:
            rec.preempted = sorted(preempted)
            self.unadmitted.update(preempted)

        scheduled = out.num_scheduled_tokens
        spec_tokens = session.spec_tokens(out)
        for rid in waiting_before:
            req = session.request(rid)
            if req is None or (not req.num_computed_tokens and rid not in scheduled):
                continue
            n = scheduled.get(rid, 0)
            start = req.num_computed_tokens - n
            order = connector_orders.get(rid)
            ext = order.num_external_tokens if order else 0
            rec.add("admissions", Admission(rid, start - ext, ext, bool(order and order.load_async)))
            self.trace.prefix_hit_tokens += start - ext
            self.unadmitted.discard(rid)
            live = self.live[rid]
            live.first_chunk_pending = True
            live.prefill_len = live.known = req.num_tokens
            live.drafts = []  # a (re)added request has no proposals on the worker
            if order is not None and not order.load_async:
                self._connector_load(rec, rid, start, order)

        sampled = batch.sampled
        correction = self.queue.worker_corrections(session, out) if self.async_mode else {}
        if scheduled:
            self.trace.forward_steps += 1
        if self.spec:  # accepted-token counts exist only in a spec-decode engine
            self.accepted_reset.update(mirror.begin_step(scheduled))
            for rid in self.accepted_reset.intersection(scheduled):
                self.trace.after_accepted_reset.add((rec.step, rid))
                self.accepted_reset.discard(rid)
        for rid in scheduled:  # dict order is the batch order vLLM built
            sampled[rid] = self._run_row(rec, rid, scheduled[rid], spec_tokens.get(rid, []), batch,
                                         correction.get(rid, 0))

        recv_new = {rid: o for rid, o in connector_orders.items() if o.load_async} if connector_orders else {}
        if self.recv_tracked:
            recv_new, failed = self._recv_progress(rec, recv_new)
        else:  # the default: an async load finishes in the forward that started it, and never fails
            failed = set()
        if recv_new:
            for rid in sorted(recv_new):
                req = session.request(rid)
                if rid not in failed and req is not None and scheduler_session.is_waiting_for_remote_kv(req):
                    self._connector_load(rec, rid, req.num_computed_tokens, recv_new[rid])
            rec.recv_done = sorted(recv_new)
        batch.recv_done = set(recv_new)
        batch.recv_failed = failed
        if self.connector is not None and self.connector.save_requests:
            self._save_offloads(rec, out)

    def _apply(self, rec: StepRecord, batch: Batch) -> None:
        """The engine core hands a batch's output to the scheduler (`update_from_output`), after the
        aborts that arrived while it executed (`EngineCore._process_aborts_queue`)."""
        aborts = self._drain_in_flight_aborts() if self.in_flight_aborts else None
        if aborts:
            self.trace.in_flight_aborts.update((rec.step, rid) for rid in aborts)
            self._abort(rec, aborts)
        session = self.session
        before = None
        if batch.stale:  # rows whose request was preempted after the batch was scheduled (rare)
            before = {}
            for rid in batch.stale:
                req = session.request(rid)
                if req is not None and not req.is_finished():
                    before[rid] = (req.num_computed_tokens, getattr(req, "num_output_placeholders", 0))
        sent = self._sends_finished(rec) if self.send_pending else None
        session.feed(batch.out, batch.sampled, batch.recv_done, batch.recv_failed, sent)
        if batch.recv_failed:  # vLLM took the failure now: the request's next schedule admits it anew
            self.unadmitted.update(rid for rid in batch.recv_failed if self._running(rid))
        if self.connector is not None and self.connector.saves:
            self._drain_saves(rec)
        for rid, counts in before.items() if before else ():
            req = session.request(rid)
            now = (req.num_computed_tokens, getattr(req, "num_output_placeholders", 0))
            if now != counts and not req.is_finished():
                raise StaleDeliveryError(
                    STALE_OUTPUT_CHANGES_NOTHING, f"batch {batch.index}'s stale output for {rid} (preempted after it was scheduled) moved "
                    f"num_computed_tokens/num_output_placeholders from {counts} to {now}")
        self._after_update(rec, batch.out.num_scheduled_tokens)  # `batch.scheduled`, inline

    # ---- pieces ----------------------------------------------------------------------
    def _running(self, rid: str) -> bool:
        """Arrived and not finished."""
        live = self.live.get(rid)
        return live is not None and live.req.status not in scheduler_session.FINISHED_STATUSES  # `not is_finished()`

    def _recv_progress(self, rec: StepRecord, new: dict) -> tuple[dict, set[str]]:
        """One forward of the async loads in flight: `new` (this step's orders) start with
        `connector_recv_steps` forwards to go; a load with none left finishes now (the worker's
        `get_finished` reports it in `finished_recving`), and the `connector_failed_load`-th load
        fails (reported in `failed_recving` too: Scheduler._handle_failed_recving resets the
        request to recompute, _update_waiting_for_remote_kv frees or caches its blocks)."""
        e = self.s.engine
        for rid, order in new.items():
            self._async_loads += 1
            fails = self._async_loads == e.connector_failed_load
            self.recv_pending[rid] = [e.connector_recv_steps, order, fails]
        done, failed = {}, set()
        for rid, entry in list(self.recv_pending.items()):
            if entry[0] > 0:
                entry[0] -= 1
                continue
            del self.recv_pending[rid]
            done[rid] = order = entry[1]
            if entry[2]:
                failed.add(rid)
                self.trace.connector_events.append((rec.step, "load-fail", rid,
                                                    f"{order.num_external_tokens} tokens (failed_recving)"))
            else:
                self.trace.connector_events.append((rec.step, "recv-done", rid,
                                                    f"{order.num_external_tokens} tokens after "
                                                    f"{e.connector_recv_steps + 1} forward(s)"))
        return done, failed

    def _save_offloads(self, rec: StepRecord, out: Any) -> None:
        """The worker side of a saving connector, after the forward and its post-forward copies
        (`wait_for_save`): each boundary-state hand-off of this schedule (the scheduler names the
        exact block: `SchedulerOutput.kv_connector_block_state.boundary_state_offloads`) is copied
        holding what the kernel model of its mamba group says that block holds now, keyed as
        Mooncake's store keys it, by the request's block hash at the boundary; one entry holds
        every group's state (a store keeps each group's layers), and a load gives each group its
        own. Hand-offs of a request finished or preempted in this schedule are dropped, as
        Mooncake's and the CPU offload's schedulers do. The entries wait for the request's
        `request_finished` and reach the store when its send finishes, each only with a state for
        every group: a block holding the wrong state is a wrong entry (docs/REACH.md)."""
        c = self.connector
        if c.offloads is None:
            c.offloads = []  # said once per run
            self.trace.connector_events.append((rec.step, "save-unsupported", "-", scheduler_session.NO_BOUNDARY_STATE_OFFLOADS))
            c.save_requests = False
            return
        if not c.offloads:
            return
        offloads, c.offloads = c.offloads, []
        unit = self.session.hash_block_size
        null = self.session.null_block_id
        gone = self.session.preempted(out)
        groups = self.session.mamba_groups
        models = self.mirror.models
        for rid, group, block, tokens in offloads:
            live = self.live.get(rid)
            if group not in groups or live is None:
                continue
            g = groups.index(group)
            req = live.req
            if tokens % unit:
                raise SchedulerContractError(OFFLOAD_ON_HASH_GRID, f"{rid}'s boundary-state hand-off of block {block} is "
                                             f"the state after {tokens} tokens, off the {unit}-token hash grid: a store "
                                             "connector has no prefix hash to key it by (Mooncake asserts)")
            index = tokens // unit - 1
            if req.is_finished() or rid in gone or block <= null or not 0 <= index < len(req.block_hashes):
                self.trace.connector_events.append((rec.step, "offload-dropped", rid, f"block {block} at {tokens} tokens"))
                continue
            state = models[g].state_of(block)
            key = bytes(req.block_hashes[index])
            entry = self.save_entries.setdefault(rid, {}).setdefault(key, [tokens, [None] * len(models)])
            entry[1][g] = state
            if g == 0:  # the trace's group
                self.trace.connector_events.append((rec.step, "save", rid, f"block {block} as the state after "
                                                    f"{tokens} tokens: holds {state}"))
            elif state != entry[1][0]:
                self.trace.connector_events.append((rec.step, "save-group", rid, f"mamba group {g}'s block {block} "
                                                    f"as the state after {tokens} tokens: holds {state}"))

    def _drain_saves(self, rec: StepRecord) -> None:
        """Requests vLLM finished since the last drain whose blocks the connector keeps
        (delay_free): their saved entries are sent, `connector_send_steps` updates from now."""
        for order in self.connector.saves:
            entries = self.save_entries.pop(order.request_id, {})
            self.send_pending[order.request_id] = [self.s.engine.connector_send_steps, entries]
            self.trace.connector_events.append((rec.step, "delay-free", order.request_id,
                                                f"request_finished keeps its blocks; {len(entries)} entries to send"))
        self.connector.saves.clear()

    def _sends_finished(self, rec: StepRecord) -> set[str]:
        """The saves the worker reports in `finished_sending` at this update_from_output; their
        entries enter the connector's store."""
        done = set()
        for rid, entry in list(self.send_pending.items()):
            if entry[0] > 0:
                entry[0] -= 1
                continue
            del self.send_pending[rid]
            done.add(rid)
            stored = 0
            for key, (tokens, states) in entry[1].items():
                if None in states:  # vLLM handed off this boundary for some groups only: nothing to restore from
                    self.trace.connector_events.append((rec.step, "save-incomplete", rid, f"the state after {tokens} "
                                                        f"tokens lacks mamba group(s) {[g for g, s in enumerate(states) if s is None]}"))
                    continue
                self.connector.store[key] = (tokens, tuple(states))
                stored += 1
            self.trace.connector_events.append((rec.step, "sent", rid, f"{stored} mamba block(s) stored"))
        return done

    def _connector_load(self, rec: StepRecord, rid: str, num_tokens: int, order: Any = None) -> None:
        saved = order.saved if order is not None else None
        rest = None
        if saved is not None:
            if saved[0] != num_tokens:
                raise HarnessError(f"{rid} loads {num_tokens} tokens but the connector matched a save of {saved[0]}")
            state, rest = saved[1][0], saved[1][1:]  # each mamba group's own saved state
        else:
            state = self.live[rid].truth.at(num_tokens)
        # the connector's worker writes into the blocks the scheduler named to it (update_state_after_alloc,
        # scheduler.py:1289-1293: the request's whole table then); a request not scheduled yet has no worker table
        tables = tuple(order.block_ids[g] for g in self._groups) if order is not None else self._held(rid)
        block = self.mirror.load(tables, num_tokens, state, rest)
        rec.add("writes", SlotWrite(rid, -(-num_tokens // self.s.engine.mamba_block_size) - 1, block, state, "connector"))

    def _run_row(self, rec: StepRecord, rid: str, n: int, drafts: list[int], batch: Batch,
                 correction: int = 0) -> list[int]:
        live = self.live[rid]
        req, truth = live.req, live.truth
        num_drafts = len(drafts)
        # the row starts where SchedulerOutput says the request's computed tokens end (the worker's
        # `num_computed_tokens`); under async that counts the previous batch's drafts as accepted,
        # which the worker corrects (`correction`, BatchQueue.worker_corrections)
        start = self.told.computed[rid] - correction
        if self.async_mode:
            if drafts:  # placeholders: the worker feeds its drafter's proposals in their place
                own = live.drafts[:num_drafts]
                drafts = own + drafts[len(own):]
        else:
            live.known = req.num_tokens
        known = live.known
        end = start + n - num_drafts  # the row's real tokens end here; its drafts follow
        tables = self.told.get(rid)
        if tables is None:
            raise SchedulerContractError(ROW_BLOCKS_AS_TOLD, f"{rid} is scheduled but the worker was never sent it")
        bs = self._state_block_size
        # check_row's four rules as one inline test (the state column + 1 against the table's length), so a
        # clean row costs a few comparisons; a row that fails it goes to check_row, which raises the rule's finding
        if (type(start) is not int or type(n) is not int or not 0 <= start <= end <= known
                or (num_drafts and start == end) or (-(-(start + n) // bs) if bs else 1) > len(tables[0])):
            check_row(rid, start, n, num_drafts, known, tables[0], bs)
        num_prompt = req.num_prompt_tokens
        spec_row, row = self.mirror.run_row(rid, tables, start, n, drafts, truth, num_prompt,
                                            live.prefill_len or num_prompt)
        read_column, read_block, read_state, outputs, writes = row
        # the scheduler's tables: they do not change until the next schedule()
        held = self._held_blocks(rid)
        check_told_blocks(rid, tables, held, read_column, writes,
                          self.mirror.rest_reads if len(tables) > 1 else (), self._null, self.session.own_scratch)
        if spec_row:
            self.trace.spec_rows.add((rec.step, rid))
        first = live.first_chunk_pending
        live.first_chunk_pending = False
        true_state = truth.at(start)
        # tuple.__new__ builds the NamedTuples without their constructors' Python frames (one per row and write)
        rec.chunks.append(_tuple_new(Chunk, (rid, start, n, num_drafts, read_column, read_block, read_state, true_state,
                                             first, first and start > 0)))
        if len(tables) > 1:
            for group, other in enumerate(self.mirror.rest_reads, 1):
                if other.read_state != true_state:
                    self.trace.mamba_group_reads.append((rec.step, group, Chunk(
                        rid, start, n, num_drafts, other.read_column, other.read_block, other.read_state, true_state,
                        first, first and start > 0)))
        recorded = rec.writes
        for write in writes:
            recorded.append(_tuple_new(SlotWrite, (rid, *write)))
        if end < known:  # a partial prefill samples nothing
            sampled: list[int] = []
        elif not drafts:
            sampled = [outputs[-1]]
        else:
            sampled = self._accept(outputs[-num_drafts - 1 :], drafts)
            batch.rejected[rid] = num_drafts + 1 - len(sampled)
        if self.async_mode:  # the worker knows its tokens before the scheduler does
            if sampled:
                live.known = end + len(sampled)
                if live.known > len(truth.tokens):
                    truth.append(sampled[len(truth.tokens) - end:])
            # the drafter proposes after a row that sampled; otherwise nothing stands behind the
            # next row's placeholders
            live.drafts = self._propose(live, rec.step, live.known) if self.spec and sampled else []
        if self.spec:
            post = self.mirror.postprocess(rid, tables, start, n, num_drafts, accepted_count(sampled))
            if post:
                check_told_blocks(rid, tables, held, -1, post, (), self._null, self.session.own_scratch)
            for col, block, state, cause in post:
                recorded.append(SlotWrite(rid, col, block, state, cause))
        return sampled

    @staticmethod
    def _accept(outputs: list[int], drafts: list[int]) -> list[int]:
        """Greedy verification: keep drafts while they match the model, then its own token."""
        sampled = []
        for i, d in enumerate(drafts):
            sampled.append(outputs[i])
            if outputs[i] != d:
                return sampled
        sampled.append(outputs[len(drafts)])
        return sampled

    def _after_update(self, rec: StepRecord, scheduled: dict[str, int]) -> None:
        drafts: dict[str, list[int]] = {}
        step = rec.step
        done = self.trace.finish_status
        # The cache audit's hash book learns each request's new hashes in request order (the first
        # request to produce a hash is the one its entries name). A request finished or aborted
        # at an earlier step has nothing new; one aborted this step still has its prompt's hashes.
        learn = self.prefix_caching
        learned = self.book.learned  # a request with no more hashes than learned has nothing new
        aborted_now = rec.aborts
        propose = self.spec and not self.async_mode
        finished = scheduler_session.FINISHED_STATUSES  # `req.status in finished` is `req.is_finished()`
        for rid, live in self.live.items():
            if rid in done:
                if learn and aborted_now and rid in aborted_now:
                    self.book.learn(rid, live.req.block_hashes, live.truth)
                continue
            req = live.req
            truth = live.truth
            if req.num_tokens > len(truth.tokens):  # extend_truth, inline
                extend_truth(truth, req)
            if learn and len(req.block_hashes) > learned.get(rid, 0):
                self.book.learn(rid, req.block_hashes, truth)
            if req.status in finished:
                done[rid] = req.status.name  # the trace's finish_status: the loop skipped every rid in it
                rec.add("finished", rid)
                continue
            # EngineCore.post_step hands the drafter's proposals to the scheduler only when
            # synchronous; under async they stay on the worker (_run_row)
            if (propose and rid in scheduled and req.num_computed_tokens >= req.num_tokens - 1
                    and req.num_output_tokens > 0):
                drafts[rid] = self._propose(live, step, len(live.truth))
        if drafts:  # set_drafts hands vLLM nothing for none
            self.session.set_drafts(drafts)

    def _propose(self, live: _Live, step: int, length: int) -> list[int]:
        """A drafter that knows the true model: after the request's first `length` tokens, its first
        `acceptance` guesses are right."""
        k = self.s.engine.num_speculative_tokens
        acc = self.s.acceptance[step % len(self.s.acceptance)] if self.s.acceptance else k
        state = live.truth.at(length)
        out = []
        for i in range(k):
            tok = next_token(state, VOCAB_SIZE)
            if i >= acc:
                tok = tok % (VOCAB_SIZE - 1) + 1  # a guess the model will reject
            out.append(tok)
            state = state.extend([tok])
        return out

    def _audit_cache(self, rec: StepRecord) -> None:
        """Record the mamba cache entries whose verdict may have changed this step: new keys, and
        keys on blocks the kernel model wrote. A key's claim never changes and a block's held state
        changes only by a write, so an entry judged before keeps its verdict until one of these.
        While no key was added or removed, the last scan's entries (all judged) still hold; while keys
        were only added, each new to the map, a scan would yield the last scan's entries and then
        theirs (SchedulerSession.take_added_mamba_keys), so the scan is not redone."""
        model = self.model
        written = model.dirty  # `take_dirty`, inline: the blocks written since the last step
        if written:
            model.dirty = set()
        version = self.session.cache_keys_version()
        if version == self._scanned_version:
            if not written or written.isdisjoint(self._scanned_blocks):
                return
            changed = [(key, block) for key, block in self._scanned if block.block_id in written]
            self._describe(rec, changed, self.known_entries)
            return
        added = self.session.take_added_mamba_keys()
        if added is not None:
            known = self.known_entries
            changed = ([(key, block) for key, block in self._scanned if block.block_id in written]
                       if written and not written.isdisjoint(self._scanned_blocks) else [])
            self._describe(rec, changed + added, known)  # the new keys' entries are not in `known`: new
            self._scanned += added
            known.update([(key, block.block_id) for key, block in added])
            self._scanned_blocks.update([block.block_id for _, block in added])
            self._scanned_version = version
            return
        scanned = list(self.session.cached_mamba_blocks())
        seen = {(key, block.block_id) for key, block in scanned}
        known = self.known_entries
        self._describe(rec, [(key, block) for key, block in scanned
                             if (key, block.block_id) not in known or block.block_id in written], known)
        self.known_entries = seen
        self._scanned, self._scanned_version = scanned, version
        self._scanned_blocks = {block.block_id for _, block in scanned}

    def _check_audit_view(self) -> None:
        """Tripwire for the incremental audit: at the end of a run the cache's mamba keys must be
        the ones the last scan saw, unless the change counter says they moved since. If not,
        this vLLM changes its prefix cache in a way the bridge does not count, and the audit
        would miss entries: a tool failure, not a clean run."""
        if self.session.cache_keys_version() != self._scanned_version:
            return
        actual = {(key, block.block_id) for key, block in self.session.cached_mamba_blocks()}
        if actual != self.known_entries:
            raise HarnessError(f"the cache audit saw {len(self.known_entries)} mamba cache entries but the cache "
                               f"holds {len(actual)}: this vLLM changes its prefix cache in a way "
                               "SchedulerSession.cache_keys_version does not count")

    def _describe(self, rec: StepRecord, pairs: list, known: set[tuple[bytes, int]]) -> None:
        """Append a cache entry per (key, block) in `pairs`; those not in `known` are new."""
        describe = self.auditor.entry
        for key, block in pairs:
            new = (key, block.block_id) not in known
            entry = scheduler_session.SchedulerSession.mamba_entry(key, block)
            if new:
                self.trace.hashed_snapshots += 1
            rec.add("cache", describe(entry.block_hash, entry.block_id, entry.primary, entry.claimed_tokens, new))
