"""When a scenario's requests arrive and are aborted, and when a run of it is over: one plan for
every loop that drives vLLM through a scenario (the harness, the conformance driver, the
engine tier's replay and the speed bench), so they cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from mambafuzz.model.scenario import Scenario

DONE = "done"  # every request arrived and none is left
BOUND = "bound"  # still going at the liveness bound: the run stalled


@dataclass
class StepPlan:
    ids: list[str]
    arrivals_at: dict[int, list[int]] = field(default_factory=dict)  # step -> request indexes
    aborts_at: dict[int, list[str]] = field(default_factory=dict)  # step -> request ids (input queue)
    # step -> request ids whose abort arrives while that step's batch executes (the aborts queue)
    in_flight_aborts_at: dict[int, list[str]] = field(default_factory=dict)
    last_arrival: int = -1
    bound: int = 0  # the liveness bound: a run still going at this step has stalled
    max_tokens: list[int] = field(default_factory=list)
    # continuations not arrived yet: request index -> (index of the request it continues, arrival step)
    pending: dict[int, tuple[int, int]] = field(default_factory=dict)
    # step -> reset_running_requests of the engine's `reset_prefix_cache` call at that step (Scenario.prefix_cache_resets)
    resets_at: dict[int, bool] = field(default_factory=dict)
    scenario: Scenario | None = None

    @classmethod
    def of(cls, s: Scenario) -> StepPlan:
        plan = cls(s.request_ids(), bound=s.liveness_bound(), max_tokens=[r.max_tokens for r in s.requests], scenario=s)
        for i, (rid, r) in enumerate(zip(plan.ids, s.requests, strict=True)):
            if r.continues is not None:
                plan.pending[i] = (r.continues, r.arrival_step)
            else:
                plan.arrivals_at.setdefault(r.arrival_step, []).append(i)
            if r.abort_step is not None:
                due = plan.in_flight_aborts_at if r.abort_in_flight else plan.aborts_at
                due.setdefault(r.abort_step, []).append(rid)
        plan.last_arrival = max((r.arrival_step for r in s.requests), default=-1)
        plan.resets_at = {r.step: r.reset_running_requests for r in s.prefix_cache_resets}
        return plan

    def arrivals(self, step: int) -> list[tuple[int, str]]:
        """(index, request id) of the requests that arrive at `step`, in scenario order (cheap on
        the many steps where none does: every driving loop asks on every step)."""
        due = self.arrivals_at.get(step)
        return [(i, self.ids[i]) for i in due] if due else []

    def continuations(self, step: int, ended: Callable[[str], bool]) -> list[tuple[int, int, str]]:
        """(index, index of the request it continues, request id) of the continuations that arrive
        at `step`: due by now, and the request each continues has `ended` (arrived and finished or
        aborted). Each is handed out once; call once per step, after `arrivals`."""
        if not self.pending:
            return []
        due = [(i, j, self.ids[i]) for i, (j, at) in self.pending.items() if at <= step and ended(self.ids[j])]
        for i, _, _ in due:
            del self.pending[i]
        return due

    def aborts(self, step: int, running: Callable[[str], bool]) -> list[str]:
        """The requests aborted at `step` that are still `running` (arrived, not finished)."""
        due = self.aborts_at.get(step)
        return [rid for rid in due if running(rid)] if due else []

    def in_flight_aborts(self, step: int, running: Callable[[str], bool]) -> list[str]:
        """The requests whose abort arrives while `step`'s batch executes, still `running`."""
        due = self.in_flight_aborts_at.get(step)
        return [rid for rid in due if running(rid)] if due else []

    def reset(self, step: int) -> bool | None:
        """The `reset_running_requests` of the prefix-cache reset due at `step`, None when none is: the
        engine core takes it from its input queue after the step's arrivals and aborts. A reset due
        after the run ended never happens."""
        return self.resets_at.get(step) if self.resets_at else None

    def done(self, step: int, has_unfinished: bool) -> bool:
        """Every request has arrived and none is left."""
        return self.end(step, has_unfinished) == DONE

    def end(self, step: int, has_unfinished: bool) -> str | None:
        """Why a run stops before `step` (DONE, else BOUND), or None while it goes on."""
        if step > self.last_arrival and not has_unfinished and not self.pending:
            return DONE
        return BOUND if step >= self.bound else None

    def feed(self, step: int, session: Any, prompts: list[list[int] | None]) -> None:
        """Add `step`'s arrivals to a scheduler session (mambafuzz.sim.bridge.scheduler_session.SchedulerSession) and
        abort its due requests that are still running: the whole of it for a loop that keeps no
        state of its own per request (the speed bench, the conformance driver). `prompts` are
        `Scenario.static_prompts()`; a continuation's prompt is built here from the tokens the
        request it continues holds in the session (prompt and generated)."""
        for i, rid in self.arrivals(step):
            session.add_request(rid, prompts[i], self.max_tokens[i], float(step), self.scenario.requests[i].priority)
        if self.pending:
            def ended(rid: str) -> bool:
                return (req := session.request(rid)) is not None and req.is_finished()

            for i, j, rid in self.continuations(step, ended):
                earlier = session.request(self.ids[j])
                prompt, _ = self.scenario.continuation_prompt(i, earlier.all_token_ids, earlier.num_prompt_tokens)
                session.add_request(rid, prompt, self.max_tokens[i], float(step), self.scenario.requests[i].priority)

        def running(rid: str) -> bool:
            return (req := session.request(rid)) is not None and not req.is_finished()

        # a loop without a batch queue of its own takes an in-flight abort at the step's input
        aborts = self.aborts(step, running) + self.in_flight_aborts(step, running)
        if aborts:
            session.abort(aborts)
        reset = self.reset(step)
        if reset is not None:
            session.reset_prefix_cache(reset)


def propose_drafts(session: Any, scheduled: Iterable[str], step: int, s: Scenario, token: int) -> dict[str, int]:
    """A constant drafter for the loops that keep no state per request (the speed bench, the
    conformance driver): after `step`, every scheduled request that decodes next gets the
    engine's k drafts, all `token`, through the session; returns how many of them the next
    step accepts, per request (the scenario's acceptance pattern at `step`, else all k)."""
    k = s.engine.num_speculative_tokens
    accept = s.acceptance[step % len(s.acceptance)] if s.acceptance else k
    proposals: dict[str, list[int]] = {}
    for rid in scheduled:
        req = session.request(rid)
        if (req is not None and not req.is_finished() and req.num_output_tokens > 0
                and req.num_computed_tokens >= req.num_tokens - 1):
            proposals[rid] = [token] * k
    session.set_drafts(proposals)
    return dict.fromkeys(proposals, accept)
