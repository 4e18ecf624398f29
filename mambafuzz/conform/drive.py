"""Drive a scenario through vLLM's real Scheduler and yield, per step, what vLLM's own worker code
does for each scheduled row (mambafuzz/conform/v1.py), so an adapter can hold the kernel model's
bookkeeping against it step by step.

A minimal loop, like bench/harness_speed.py's `bare_run`: every sampled token and every draft is
one constant token, drafts are accepted per the scenario's acceptance pattern, and the scheduler's
-1 placeholder drafts (a padded one-token prompt tail) are never accepted unless, under async
scheduling, the worker's drafter stands behind them. No truth, no kernel
model, no oracle. KV-connector claims are driven as the constant worker drives them (loads succeed,
async ones in the forward that ordered them; no saves), so a row can start from a loaded prefix.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from mambafuzz.conform.rows import RowInput, RowPlan, StepInput
from mambafuzz.conform.v1 import V1Worker
from mambafuzz.conform.v2 import V2Worker
from mambafuzz.model import runners as model_runners
from mambafuzz.model.scenario import Scenario, ample_pool_blocks
from mambafuzz.model.step_plan import StepPlan
from mambafuzz.sim.bridge import scheduler_session
from mambafuzz.sim.engine.engine_core import BatchQueue
from mambafuzz.sim.engine.worker_contract import vllm_frame
from mambafuzz.sim.worker.constant_worker import ConstantWorker
from mambafuzz.sim.worker.worker_tables import WorkerTables


@dataclass(frozen=True)
class ConformStep:
    step: int
    input: StepInput
    plans: tuple[RowPlan, ...]


# Each registered runner's driver of vLLM's own worker code, under its name in mambafuzz/model/runners.py.
WORKERS: dict[str, type] = {V1Worker.runner: V1Worker, V2Worker.runner: V2Worker}


class SchedulerRaised(Exception):
    """vLLM's scheduler or KV-cache manager raised while the drive ran the input: a `vllm_crash`
    for the scheduler target (`mambafuzz repro`) to report, and nothing the conformance tier can
    judge (no row after it exists). Not a tool failure: its frame is vLLM's own (v1/core)."""


def worker_class(name: str) -> type:
    """The conformance worker of the runner registered as `name`; an unknown name, or one without
    a worker here, is a one-line UnknownRunner."""
    return model_runners.part_of(WORKERS, name, "conformance worker", "mambafuzz.conform.drive.WORKERS")


def _worker_for(runner: str, session: scheduler_session.SchedulerSession, num_blocks: int, max_model_len: int):
    sched = session.scheduler
    spec = sched.kv_cache_config.kv_cache_groups[session.mamba_group].kv_cache_spec
    manager = sched.kv_cache_manager.coordinator.single_type_managers[session.mamba_group]
    return worker_class(runner)(sched.vllm_config, spec, num_blocks, session.hash_block_size,
                           manager.cache_hit_alignment_tokens, max_model_len, max_num_reqs=sched.max_num_running_reqs)


def drive(s: Scenario, runners: tuple[str, ...] | None = None) -> Iterator[ConformStep]:
    """Run `s` through the real scheduler, under the engine core's loop for its scheduling mode
    (mambafuzz.sim.engine.engine_core.BatchQueue); yield one ConformStep per forward that ran rows or dropped requests, with the
    RowPlans of every runner in `runners` (None: every registered runner). Each row's table is the one
    the worker keeps from SchedulerOutput (mambafuzz.sim.worker.worker_tables). Under async scheduling each row starts
    where the worker really is and its placeholder drafts are the worker's own proposals
    (mambafuzz.sim.worker.constant_worker), as in the harness."""
    engine = s.engine
    num_blocks = engine.num_gpu_blocks or ample_pool_blocks(s)
    session = scheduler_session.SchedulerSession(engine, num_blocks, s.max_model_len(), None, s.uses_connector)
    workers = [_worker_for(r, session, num_blocks, s.max_model_len()) for r in runners or model_runners.names()]
    plan = StepPlan.of(s)
    prompts = s.static_prompts()
    queue = BatchQueue(session.batch_queue_depth)
    bare = ConstantWorker(session, s, queue)
    told = WorkerTables((session.mamba_group,), session.runner)
    for step in range(plan.bound):
        try:
            if plan.end(step, session.has_unfinished() or bool(queue)) is not None:
                return
            plan.feed(step, session, prompts)
            ran = _run_step(step, session, queue, bare, told, workers)
        except Exception as exc:
            where = vllm_frame(exc)
            if where.startswith("vllm/v1/core/"):
                raise SchedulerRaised(f"vLLM's scheduler raised {type(exc).__name__} at {where} (step {step}): "
                                      "the scheduler target's finding (mambafuzz repro), not judged here") from exc
            raise
        yield from ran


def _run_step(step: int, session: scheduler_session.SchedulerSession, queue: BatchQueue, bare: ConstantWorker, told: WorkerTables,
              workers: list) -> list[ConformStep]:
    """One engine-core step: schedule, every worker's view of each forward, the output fed back."""
    ran: list[ConformStep] = []

    def forward(batch) -> None:
        out = batch.out
        told.update(out)  # the tables the worker keeps from the messages alone
        rows = tuple(RowInput(r.req_id, r.start, r.num_scheduled, r.num_drafts,
                              session.request(r.req_id).num_prompt_tokens,
                              tuple(told.get(r.req_id)[0]), r.num_sampled or 1)
                     for r in bare.forward(batch, step))
        step_input = StepInput(rows, frozenset(out.finished_req_ids), frozenset(out.preempted_req_ids or ()),
                               frozenset(out.scheduled_cached_reqs.resumed_req_ids or ()))
        plans = tuple(p for w in workers for p in w.step(step_input))  # empty steps still drop requests
        if rows or step_input.finished or step_input.preempted or step_input.resumed:
            # a step that only drops requests is yielded too: the kernel model must forget
            # them as vLLM's worker did (a preemption in a step with no rows, under pipeline
            # stages, left the mirror a stale running column: a false precopy)
            ran.append(ConformStep(step, step_input, plans))

    queue.step(session, forward, lambda batch: bare.apply(batch, step))
    return ran
