"""The engine core's control flow around vLLM's scheduler (v1/engine/core.py), for every loop that
drives a SchedulerSession: the harness, the conformance driver and the speed bench.

`EngineCore.step` runs one batch at a time: schedule, execute, apply its output. Under async
scheduling `EngineCore.step_with_batch_queue` keeps `max_concurrent_batches` batches in flight:
it schedules while the queue has room and requests remain, and only then takes the oldest batch's
output and applies it (`update_from_output`). Both are `BatchQueue.step` here, with depth 1 and
depth 2. A driver supplies the worker: `forward(batch)` runs right after the batch is scheduled
(forwards run in stream order and the scheduler reads no state, so running it then writes what
the GPU writes), and `apply(batch)` hands its output back to the scheduler.

It also keeps the two facts about in-flight batches that the worker side needs: how many drafts
each row had rejected (the next batch was scheduled as if all were accepted, `worker_corrections`)
and which rows' requests were preempted before their output came back (stale rows).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mambafuzz.sim.bridge.vllm_compat.output import resumed_req_ids


@dataclass
class Batch:
    """One SchedulerOutput handed to the worker, with the worker's answer, until it is applied."""

    index: int
    out: Any
    sampled: dict[str, list[int]] = field(default_factory=dict)
    recv_done: set[str] = field(default_factory=set)
    recv_failed: set[str] = field(default_factory=set)  # of recv_done: loads the worker reports failed
    load_errors: set[str] = field(default_factory=set)  # sync loads the worker reports failed (failed_recving alone)
    rejected: dict[str, int] = field(default_factory=dict)  # drafts each spec-decode row had rejected
    stale: set[str] = field(default_factory=set)  # rows whose request was preempted before it was applied
    applied: bool = False

    @property
    def scheduled(self) -> dict[str, int]:
        return self.out.num_scheduled_tokens


class BatchQueue:
    """`EngineCore.step` (depth 1) and `EngineCore.step_with_batch_queue` (depth > 1)."""

    def __init__(self, depth: int):
        self.depth = depth
        self.in_flight: deque[Batch] = deque()  # newest first, as the engine core's batch_queue
        self.count = 0

    def __bool__(self) -> bool:
        return bool(self.in_flight)

    def step(self, session: Any, forward: Callable[[Batch], None],
             apply: Callable[[Batch], None]) -> tuple[Batch | None, Batch | None]:
        """One engine step; returns (the batch scheduled, the batch applied), either may be None."""
        scheduled = None
        if session.has_requests():
            scheduled = Batch(self.count, session.schedule())
            self.count += 1
            preempted = session.preempted(scheduled.out)
            if preempted:  # the batches still in flight now carry these requests' output as stale
                for queued in self.in_flight:
                    queued.stale.update(preempted.intersection(queued.scheduled))
            forward(scheduled)
            self.in_flight.appendleft(scheduled)
            if len(self.in_flight) < self.depth and (scheduled.scheduled or session.has_requests()):
                return scheduled, None
        elif not self.in_flight:
            return None, None
        batch = self.in_flight.pop()
        batch.applied = True
        apply(batch)
        return scheduled, batch

    def worker_corrections(self, session: Any, out: Any) -> dict[str, int]:
        """Drafts the worker takes back before running `out`: the scheduler counted the drafts of
        batches still in flight as accepted; the worker runs each row from where its request really
        is. V1 (`gpu_model_runner._update_states`) takes the rejected drafts back for a request that
        was in the previous batch and was not dropped since (`deferred_spec_decode_corrections`,
        applied ahead of `preprocess_mamba` in align mode); V2 keeps its own count on the GPU,
        advanced by the tokens each row kept (`gpu/input_batch.py` `post_update`), which lands on the
        same position. With pipeline parallelism (V2 only) the batch a row's request was last in may
        be any of the in-flight ones (`decode_stagger` keeps it out of the next `stages - 1`), so
        every unapplied batch counts. Call it before `out`'s forward, while `out` is not queued.
        The rule, including what a request dropped or sent as new forgets: `in_flight_corrections`."""
        pending = [b.rejected for b in self.in_flight if b.rejected]  # forwarded, not applied (apply pops them)
        if not pending:
            return {}
        return in_flight_corrections(pending, out, session.preempted(out))


def in_flight_corrections(rejected_per_batch: list[dict[str, int]], out: Any, preempted: set[str]) -> dict[str, int]:
    """The rule of `BatchQueue.worker_corrections` on plain data (the runtime audit plugin keeps its
    own in-flight batches): the drafts each request had rejected in the batches still in flight
    when `out` was scheduled.

    A request `out` drops (preempted or resumed) or sends as new is a fresh request to the worker
    from then on (V2 forgets it in `finish_requests` and adds it anew; V1 replaces its state on
    resumption), so the drafts its earlier incarnation had rejected are deleted from those batches'
    dicts here, for good: they never move the new incarnation's rows. Before
    `reset_prefix_cache(reset_running_requests=True)` became an event, no request was scheduled
    again while batches from before its preemption were in flight (vLLM skips it while its stale
    output drains, scheduler.py:934-939); the reset drops that output instead, so it can be."""
    fresh = preempted | resumed_req_ids(out) | {new.req_id for new in out.scheduled_new_reqs}
    rejected: dict[str, int] = {}
    for batch in rejected_per_batch:
        for rid in fresh.intersection(batch):
            del batch[rid]
        for rid, n in batch.items():
            rejected[rid] = rejected.get(rid, 0) + n
    return rejected
