"""Drive one scenario through vLLM's real Scheduler and KV-cache manager, with the kernel
model standing in for the GPU, and record a Trace.

scenario -> (this module) -> trace -> oracle.  The harness judges nothing itself.  It plays
the engine core and the model runner: StepPlan says what arrives and is aborted when,
mambafuzz.sim.worker.worker_mirror applies each SchedulerOutput to the kernel model as the worker would (the
runtime audit plugin applies it through the same code), and mambafuzz.sim.engine.cache_audit describes every
published mamba block; this module turns their results into the trace and answers the
scheduler with greedy tokens and drafts.

Its pieces with a job of their own live beside it (the worker contract, the connector's worker
side, the cache scan, the pool facts). What stays, a little over 600 lines, is the loop and the
worker's forward, whose per-row work is inlined on purpose: it is the fuzzer's hot path (issue #33,
bench/harness_speed.py), and splitting it further costs calls on every row.
"""

from __future__ import annotations

import _signal
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mambafuzz.model.scenario import VOCAB_SIZE, Scenario, ScenarioError, ample_pool_blocks
from mambafuzz.model.step_plan import BOUND, StepPlan
from mambafuzz.sim.bridge import configs, scheduler_session
from mambafuzz.sim.bridge.vllm_compat import VllmUnsupported
from mambafuzz.sim.engine.attention_kv import AttentionBlocks
from mambafuzz.sim.engine.cache_audit import BlockAuditor
from mambafuzz.sim.engine.cache_scan import CacheScan
from mambafuzz.sim.engine.connector import ConnectorWorker, scripted_defers, scripted_hits
from mambafuzz.sim.engine.engine_core import Batch, BatchQueue
from mambafuzz.sim.engine.hash_book import HashBook
from mambafuzz.sim.engine.pool_facts import PoolFacts
from mambafuzz.sim.engine.worker_contract import (
    ROW_BLOCKS_AS_TOLD,
    SCHEDULE_RETURNS_OUTPUT,
    STALE_OUTPUT_CHANGES_NOTHING,
    HarnessError,
    SchedulerContractError,
    StaleDeliveryError,
    check_row,
    check_told_blocks,
    crash_or_tool_error,
)
from mambafuzz.sim.state import PrefixStates, next_token
from mambafuzz.sim.trace import Admission, BatchEvent, Chunk, ResetRecord, SlotWrite, StepRecord, Trace
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


_tuple_new = tuple.__new__
_new = object.__new__

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
        trace.crash = crash_or_tool_error(exc, -1)
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
    for observe in RUN_OBSERVERS:
        observe(scenario, trace)
    return trace


# Called with (scenario, trace) after every run: a generator's feedback from what a run reached
# (the `pairs` generator's state coverage, mambafuzz.search.pairs_worker). Empty unless one registers.
RUN_OBSERVERS: list[Callable[[Scenario, Trace], None]] = []


# Quiet steps in a row (nothing scheduled, in flight or due) after which a run is a stall: more than
# any connector deferral (RequestSpec.connector_defer <= 8) keeps a request waiting without a row
IDLE_STEPS_TO_STALL = 32


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
        # the attention groups' blocks, judged where a prefix-cache hit serves them (no hits without caching);
        # their told tables come from the same pass over each output as the mamba groups'
        attention = [g for g, kind in enumerate(session.group_kinds) if kind != "mamba"] if prefix_caching else []
        self.told = WorkerTables(groups, session.runner, side_groups=attention)
        self._groups = groups
        self.attention = AttentionBlocks(self.told, session.group_block_sizes, session.null_block_id,
                                         trace) if attention else None
        self._null = session.null_block_id
        self.model = models[0]
        self.mirror = WorkerMirror(models, self.spec)
        self.plan = plan
        self.book = HashBook(session.hash_block_size)
        self.cache_scan = CacheScan(session, BlockAuditor(self.book, self.model, e.mamba_block_size), trace)
        # live requests not admitted yet, or preempted since: the only ones an admission can be
        self.unadmitted: set[str] = set()
        self.accepted_reset: set[str] = set()  # V1 forgot their accepted count; not scheduled since
        self.async_mode = session.async_scheduling
        self.queue = BatchQueue(session.batch_queue_depth)  # the engine core's batches in flight
        self._in_flight_step = -1
        self._step: tuple = ()  # (record, batch event, admissible requests) of the step running
        self._state_block_size = e.mamba_block_size if prefix_caching else None  # check_row's grid
        self.in_flight_aborts: list[str] = []  # delivered by the aborts queue at the next update
        self.pool_facts = PoolFacts(session, trace)
        self._inserted = session.inserted_blocks  # the mamba blocks keyed since it was last cleared
        if self.async_mode:
            session.cache_keys_version()  # install the key watch before the first schedule()
        self.connector = session.connector if prefix_caching else None  # it sees nothing without prefix caching
        # its worker side: async loads and saves in flight (both empty under the default knobs)
        self.transfers = ConnectorWorker(self.connector, e, session, trace.connector_events,
                                         scripted_hits(scenario, self.ids), scripted_defers(scenario, self.ids))

    # ---- main loop -------------------------------------------------------------------
    def run(self) -> None:
        step = 0
        plan = self.plan
        # the last step with input due (arrivals, aborts, resets); continuations wait on requests ending
        last_input = max([plan.last_arrival, *plan.aborts_at, *plan.in_flight_aborts_at, *plan.resets_at])
        quiet = 0
        try:
            while True:
                end = plan.end(step, self.session.has_unfinished() or bool(self.queue)
                               or self.transfers.busy())
                if end is not None:
                    self.trace.hit_bound = end == BOUND
                    break
                if time.monotonic() > self.deadline:
                    self.trace.timed_out = True
                    break
                self._engine_step(step)
                # A quiet step: no row ran, no batch in flight holds a row, no transfer is under way, no input is
                # due any more. vLLM's scheduler has no clock, so after a quiet step the next schedule() sees
                # the same state and schedules nothing again: a fixed point. IDLE_STEPS_TO_STALL of them in a
                # row end the run as a stall now rather than at its bound (thousands of steps for long prompts).
                if (step > last_input and not self.trace.steps[-1].chunks and not self.transfers.busy()
                        and not plan.pending and not any(b.out.num_scheduled_tokens for b in self.queue.in_flight)):
                    quiet += 1
                    if quiet >= IDLE_STEPS_TO_STALL:
                        self.trace.hit_bound = True
                        self.trace.stopped_idle_at = step - quiet + 1  # the first quiet step
                        break
                else:
                    quiet = 0
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
            self.trace.crash = crash_or_tool_error(exc, step)
        if self.prefix_caching and self.trace.crash is None and not self.trace.timed_out:
            self.cache_scan.check_view()
        if self.trace.crash is None and not self.trace.timed_out and not self.trace.hit_bound:
            self.trace.held_at_end = self.session.block_holders()
            self.trace.request_state_at_end = self.session.request_state_left()
            if self.trace.steps and (not self.trace.pool or self.trace.pool[-1][0] != len(self.trace.steps) - 1):
                self.pool_facts.walk(len(self.trace.steps) - 1)
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
            self.cache_scan.step(rec)
        self.pool_facts.step(step)

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
            session.add_request(rid, truth.tokens, r.max_tokens, float(step), r.priority)  # vLLM gets a copy
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
        if self.plan.resets_at:
            reset = self.plan.reset(step)
            if reset is not None:
                self._reset_prefix_cache(step, reset)

    def _reset_prefix_cache(self, step: int, reset_running_requests: bool) -> None:
        """The client's `reset_prefix_cache` call, the last thing the input queue delivers before the step
        (EngineCore handles utility calls between engine steps, core.py:1573-1601, so under async scheduling
        the batches still in flight stay queued: a request it preempts has their rows as stale output,
        dropped on delivery, `_preempt_request(drop_stale_output=True)`, scheduler.py:1571-1614). The worker
        learns of it only from the next SchedulerOutput (`preempted_req_ids`, then the request resumed with
        a new table), like every preemption."""
        result = self.session.reset_prefix_cache(reset_running_requests)
        if result.preempted:  # waiting again: the next schedule() may readmit them (an admission)
            self.unadmitted.update(result.preempted)
        if self.prefix_caching:
            self.cache_scan.after_reset(result.mamba_keys_after)
        left = tuple(sorted((block, key.hex()) for key, block in result.keys_after)) if result.succeeded else ()
        self.trace.resets.append(ResetRecord(
            step, reset_running_requests, result.succeeded, result.preempted, len(result.keys_before),
            len(result.keys_after), left, result.hashed_after if result.succeeded else (),
            result.keys_after == result.keys_before))

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
            session.add_request(rid, truth.tokens, r.max_tokens, float(step), r.priority)  # vLLM gets a copy
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
            self.transfers.drain_saves(rec.step)
        rec.aborts = rec.aborts + aborts if rec.aborts else aborts
        for rid in aborts:
            self.trace.finish_status[rid] = "FINISHED_ABORTED"

    def _forward(self, rec: StepRecord, batch: Batch, waiting_before: Sequence[str]) -> None:
        """The worker's forward of a batch vLLM just scheduled, on the kernel model; `waiting_before`
        are the requests that could be admitted by that schedule()."""
        session = self.session
        out = batch.out
        connector_orders = self.connector.take_orders() if self.connector is not None else {}
        if self.connector is not None and self.connector.deferred:
            self.transfers.check_deferred(rec.step, out)

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
        hits: list[tuple[str, int]] = []  # (request, prefix-cache hit tokens) admitted by this schedule()
        for rid in waiting_before:
            req = session.request(rid)
            if req is None or (not req.num_computed_tokens and rid not in scheduled):
                continue
            n = scheduled.get(rid, 0)
            start = req.num_computed_tokens - n
            order = connector_orders.get(rid)
            ext = order.num_external_tokens if order else 0
            rec.add("admissions", Admission(rid, start - ext, ext, bool(order and order.load_async)))
            if self.attention is not None and start > ext:
                hits.append((rid, start - ext))
            self.trace.prefix_hit_tokens += start - ext
            self.unadmitted.discard(rid)
            live = self.live[rid]
            live.first_chunk_pending = True
            live.prefill_len = live.known = req.num_tokens
            live.drafts = []  # a (re)added request has no proposals on the worker
            if order is not None and not order.load_async:
                if self.transfers.sync_load_fails(rec.step, order):
                    batch.load_errors.add(rid)  # nothing written: the blocks hold what they held
                else:
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
        # the attention kernels write every row's K/V before any row reads a layer's cache: a hit may serve
        # blocks this forward computes (a same-step hit), so hits are judged after the rows
        for rid, hit in hits:
            self.attention.judge_hit(rec.step, rid, hit, self.live[rid].truth)

        recv_new = {rid: o for rid, o in connector_orders.items() if o.load_async} if connector_orders else {}
        if self.transfers.recv_tracked:
            recv_new, failed = self.transfers.recv_progress(rec.step, recv_new)
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
            self.transfers.save_offloads(rec.step, out, self.live, self.mirror.models)

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
        sent = self.transfers.sends_finished(rec.step) if self.transfers.send_pending else None
        failed = batch.recv_failed | batch.load_errors if batch.load_errors else batch.recv_failed
        session.feed(batch.out, batch.sampled, batch.recv_done, failed, sent)
        if batch.recv_failed:  # vLLM took the failure now: the request's next schedule admits it anew
            self.unadmitted.update(rid for rid in batch.recv_failed if self._running(rid))
        if self.connector is not None and self.connector.saves:
            self.transfers.drain_saves(rec.step)
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
        if self.attention is not None and order is not None:  # the loaded positions' K/V, into the blocks named
            self.attention.written(rid, num_tokens - order.num_external_tokens, num_tokens, self.live[rid].truth,
                                   tables=[order.block_ids[g] for g in self.attention.groups])
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
        attention = self.attention
        if attention is not None and (end + num_drafts) // attention.finest > start // attention.finest:
            # the row's K/V completes a block: its real tokens, and the drafts its sampler accepted
            attention.written(rid, start, end, truth, sampled[:-1] if num_drafts else ())
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
