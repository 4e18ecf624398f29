"""Drive a scenario through vLLM's real Scheduler and yield, per step, what vLLM's own worker code
does for each scheduled row (fuzz/checks/conform_vllm.py), so an adapter can hold the kernel model's
bookkeeping against it step by step.

A minimal loop, like bench/harness_speed.py's `bare_run`: every sampled token and every draft is
one constant token, drafts are accepted per the scenario's acceptance pattern, and the scheduler's
-1 placeholder drafts (a padded one-token prompt tail) are never accepted. No truth, no kernel
model, no oracle; KV-connector claims are not driven (the connector reports no tokens).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from fuzz.checks.conform_rows import RowInput, RowPlan, StepInput
from fuzz.checks.conform_v2 import V2Worker
from fuzz.checks.conform_vllm import V1Worker
from fuzz.model.scenario import Scenario, ample_pool_blocks
from fuzz.model.step_plan import StepPlan, propose_drafts
from fuzz.sim import vllm_bridge as vb

CONST_TOKEN = 7


@dataclass(frozen=True)
class ConformStep:
    step: int
    input: StepInput
    plans: tuple[RowPlan, ...]


RUNNERS = {"v1": V1Worker, "v2": V2Worker}


def _worker_for(runner: str, session: vb.SchedulerSession, num_blocks: int, max_model_len: int):
    sched = session.scheduler
    spec = sched.kv_cache_config.kv_cache_groups[session.mamba_group].kv_cache_spec
    manager = sched.kv_cache_manager.coordinator.single_type_managers[session.mamba_group]
    return RUNNERS[runner](sched.vllm_config, spec, num_blocks, session.hash_block_size,
                           manager.cache_hit_alignment_tokens, max_model_len, max_num_reqs=sched.max_num_running_reqs)


def drive(s: Scenario, runners: tuple[str, ...] = ("v1", "v2")) -> Iterator[ConformStep]:
    """Run `s` through the real scheduler; yield one ConformStep per engine step that ran rows,
    with the RowPlans of every runner in `runners` ("v1", "v2")."""
    engine = s.engine
    num_blocks = engine.num_gpu_blocks or ample_pool_blocks(s)
    session = vb.SchedulerSession(engine, num_blocks, s.max_model_len(), None)
    workers = [_worker_for(r, session, num_blocks, s.max_model_len()) for r in runners]
    k = engine.num_speculative_tokens if engine.uses_spec_decode else 0
    plan = StepPlan.of(s)
    prompts = [s.prompt_tokens(i) for i in range(len(s.requests))]
    accept_next: dict[str, int] = {}
    for step in range(plan.bound):
        if plan.done(step, session.has_unfinished()):
            return
        plan.feed(step, session, prompts)
        out = session.schedule()
        rows, sampled = [], {}
        for rid, n in out.num_scheduled_tokens.items():
            req = session.request(rid)
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            done = req.num_computed_tokens - len(drafts) >= req.num_tokens  # schedule() advanced it
            if done:
                real = [d for d in drafts if d >= 0]
                sampled[rid] = [CONST_TOKEN] * (min(accept_next.get(rid, k), len(real)) + 1)
            rows.append(RowInput(rid, req.num_computed_tokens - n, n, len(drafts), req.num_prompt_tokens,
                                 tuple(session.mamba_block_ids(rid)), len(sampled.get(rid, ())) or 1))
        step_input = StepInput(tuple(rows), frozenset(out.finished_req_ids), frozenset(out.preempted_req_ids or ()),
                               frozenset(out.scheduled_cached_reqs.resumed_req_ids or ()))
        plans = tuple(p for w in workers for p in w.step(step_input))  # empty steps still drop requests
        session.feed(out, sampled, set())
        if k:
            accept_next = propose_drafts(session, out.num_scheduled_tokens, step, s, CONST_TOKEN)
        if rows:
            yield ConformStep(step, step_input, plans)
