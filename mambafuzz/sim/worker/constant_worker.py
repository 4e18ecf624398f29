"""A worker with no model: it answers every row with one constant token, and its drafter proposes
constant drafts that the next row accepts per the scenario's acceptance pattern. The loops that
need vLLM's scheduler to take the harness's steps without the harness's truth use it: the speed
bench's bare loop and the conformance driver.

It keeps what the worker knows that the scheduler does not yet (under async scheduling): how many
tokens each request holds, and whose placeholder drafts stand for real proposals. A `-1`
placeholder nobody proposed behind (a padded one-token prompt tail) is never accepted, as in the
harness, where the model rejects it.

Its KV connector (when the scenario claims external tokens and prefix caching is on, as in the
harness) loads what the scenario scripts: a synchronous load is computed at admission, an
asynchronous one finishes in the forward of the batch that ordered it (the harness's default,
`connector_recv_steps` 0). No state moves: there is no model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mambafuzz.model.scenario import Scenario
from mambafuzz.model.step_plan import propose_drafts
from mambafuzz.sim.bridge.vllm_compat.output import resumed_req_ids
from mambafuzz.sim.engine.connector import scripted_defers, scripted_hits
from mambafuzz.sim.engine.engine_core import Batch, BatchQueue

CONST_TOKEN = 7


@dataclass(frozen=True)
class Row:
    req_id: str
    start: int  # where the worker runs the row from (num_computed_tokens, corrected under async)
    num_scheduled: int
    num_drafts: int
    num_sampled: int  # tokens the row keeps: 0 for a partial prefill


class ConstantWorker:
    def __init__(self, session: Any, scenario: Scenario, queue: BatchQueue):
        self.session, self.s, self.queue = session, scenario, queue
        self.asynchronous = session.async_scheduling
        self.k = scenario.engine.num_speculative_tokens if scenario.engine.uses_spec_decode else 0
        self.accept_next: dict[str, int] = {}  # per request: drafts its next row accepts
        self.known: dict[str, int] = {}  # async: tokens the worker holds per request
        self.proposed: set[str] = set()  # async: requests whose drafter proposed after their last row
        caching = session.scheduler.vllm_config.cache_config.enable_prefix_caching
        self.connector = session.connector if caching else None  # the harness's rule: no hits without caching
        if self.connector is not None:
            self.connector.plan = scripted_hits(scenario, scenario.request_ids())
            self.connector.defer = scripted_defers(scenario, scenario.request_ids())

    def forward(self, batch: Batch, step: int) -> list[Row]:
        """Answer `batch` (right after it was scheduled); its sampled tokens go into the batch."""
        session, out = self.session, batch.out
        asynchronous = self.asynchronous
        correction = self.queue.worker_corrections(session, out) if asynchronous else {}
        if asynchronous:
            for rid in [r.req_id for r in out.scheduled_new_reqs] + sorted(resumed_req_ids(out)):
                self.known[rid] = session.request(rid).num_tokens
                self.proposed.discard(rid)
        if self.connector is not None:  # this schedule's load orders: the async ones finish in this forward
            batch.recv_done |= {rid for rid, o in self.connector.take_orders().items() if o.load_async}
            self.connector.deferred.clear()  # the harness checks them (ConnectorWorker.check_deferred)
        rows = []
        for rid, n in out.num_scheduled_tokens.items():
            req = session.request(rid)
            drafts = out.scheduled_spec_decode_tokens.get(rid, ())
            start = req.num_computed_tokens - n - correction.get(rid, 0)  # schedule() advanced it
            have = self.known.get(rid, req.num_tokens) if asynchronous else req.num_tokens
            sampled = 0
            if start + n - len(drafts) >= have:
                real = len(drafts) if asynchronous and rid in self.proposed else sum(d >= 0 for d in drafts)
                accepted = min(self.accept_next.get(rid, self.k), real)
                sampled = accepted + 1
                batch.sampled[rid] = [CONST_TOKEN] * sampled
                if drafts:
                    batch.rejected[rid] = len(drafts) - accepted
            if asynchronous:  # the drafter proposes after every row that samples
                if sampled:
                    self.known[rid] = have + sampled
                if sampled and self.k:
                    self.proposed.add(rid)
                    self.accept_next[rid] = self.s.acceptance[step % len(self.s.acceptance)] if self.s.acceptance else self.k
                else:
                    self.proposed.discard(rid)
            rows.append(Row(rid, start, n, len(drafts), sampled))
        return rows

    def apply(self, batch: Batch, step: int) -> None:
        """Hand `batch`'s output to the scheduler; when synchronous, the drafts follow it
        (EngineCore.post_step)."""
        self.session.feed(batch.out, batch.sampled, batch.recv_done)
        if self.k and not self.asynchronous:
            self.accept_next = propose_drafts(self.session, batch.scheduled, step, self.s, CONST_TOKEN)
