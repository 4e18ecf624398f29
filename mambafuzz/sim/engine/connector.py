"""A real KV connector (KVConnectorBase_V1 + SupportsHMA) whose hits are scripted by the
scenario.  vLLM's connector factory loads it by module path; the harness hands it a plan
of external tokens per request and reads back which mamba block each load must fill.

It only plays the scheduler role: there are no workers, and the harness's kernel model
performs the "load" by writing a state into the block vLLM gave the request, and the "save"
by reading the blocks the scheduler names in `SchedulerOutput.kv_connector_block_state.
boundary_state_offloads` (collected here in `build_connector_meta`, the one place a connector
sees them), after that step's forward, as vLLM's offloading connectors copy them (the harness's
`ConnectorWorker.save_offloads` below; docs/REACH.md "What a saving connector stores").

Beyond the default (load the true state, in one step, never save), the engine's `connector_*`
knobs give it the scheduler side of the saving connectors (LMCache, NIXL, both in
vllm/distributed/kv_transfer/kv_connector/v1/): `request_finished_all_groups` answers
delay_free=True for a request it saves, and the harness reports `finished_sending` later
(Scheduler._update_from_kv_xfer_finished frees the blocks then); loads can deliver what was
saved under the prompt's block hashes (`store`) instead of the truth.

It can also defer (`RequestSpec.connector_defer`: answer None, "ask again next step", as the
OffloadingConnector does while a hit block is still being written; Scheduler.schedule skips the
request, scheduler.py:986-990) and fail a synchronous load (`EngineConfig.connector_failed_sync_load`:
the harness writes nothing into the load's blocks and reports the request in `failed_recving`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mambafuzz.sim.bridge import scheduler_session
from mambafuzz.sim.bridge.vllm_compat.api import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    RequestStatus,
    SupportsHMA,
)
from mambafuzz.sim.engine.worker_contract import DEFERRED_REQUEST_SKIPPED, OFFLOAD_ON_HASH_GRID, SchedulerContractError


@dataclass(frozen=True)
class ExternalHit:
    tokens: int  # prompt tokens the remote store holds (from the start of the prompt)
    load_async: bool


@dataclass(frozen=True)
class LoadOrder:
    """What vLLM asked the connector to load for one request, after allocation."""

    request_id: str
    num_external_tokens: int
    load_async: bool
    block_ids: tuple[list[int], ...]
    # what the load delivers when the connector loads saved states: the store entry (tokens, a state per mamba group);
    # None: the truth
    saved: Any = None


@dataclass(frozen=True)
class SaveOrder:
    """A request vLLM finished while the connector saves: its blocks (per KV-cache group, as
    `request_finished_all_groups` got them) and the block hashes the scheduler gave its tokens."""

    request_id: str
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    block_hashes: tuple[bytes, ...]


@dataclass
class ScenarioConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadOrder] = field(default_factory=list)


def scripted_hits(scenario: Any, request_ids: list[str]) -> dict[str, ExternalHit]:
    """The connector's plan for a scenario: each request's claimed external tokens (one place, for
    the harness and the model-less loops of mambafuzz.sim.worker.constant_worker)."""
    return {rid: ExternalHit(r.external_tokens, r.external_async)
            for rid, r in zip(request_ids, scenario.requests) if r.external_tokens}


def scripted_defers(scenario: Any, request_ids: list[str]) -> dict[str, int]:
    """The connector's deferrals for a scenario: request -> schedule() calls in which its lookup
    answers None (`RequestSpec.connector_defer`), for the harness and the model-less loops."""
    return {rid: r.connector_defer for rid, r in zip(request_ids, scenario.requests) if r.connector_defer}


class ScenarioConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.plan: dict[str, ExternalHit] = {}
        self.orders: list[LoadOrder] = []  # drained every step (take_orders)
        self._step_orders: list[LoadOrder] = []
        # saving (EngineConfig.connector_save): requests finished since the harness last drained
        self.save_requests = False
        self.saves: list[SaveOrder] = []
        # the scheduler's boundary-state hand-offs since the harness last drained them:
        # (request, KV-cache group, block id, boundary tokens); None: this vLLM names none
        self.offloads: list[tuple[str, int, int, int]] | None = []
        # loading saved states (connector_load_source "saved"): block hash of a mamba boundary ->
        # (tokens, what its hand-off block held when copied); the harness fills it when the
        # saving request's finished_sending arrives
        self.load_saved = False
        self.store: dict[bytes, tuple[int, tuple]] = {}  # block hash -> (tokens, a state per mamba group)
        self.mamba_block_size = 0
        self.hash_block_size = 0
        self.divergent_hits = False  # EngineConfig.connector_divergent_hits
        self._matched: dict[str, tuple[int, Any]] = {}
        # deferring (RequestSpec.connector_defer): request -> lookups still to answer None
        self.defer: dict[str, int] = {}
        self.deferred: list[str] = []  # requests answered None in the schedule() under way; the harness drains it
        self._schedules = 0  # schedule() calls so far (build_connector_meta ends each)
        self._last_deferral: dict[str, int] = {}  # request -> the schedule() of its last None answer

    def take_orders(self) -> dict[str, LoadOrder]:
        """This step's load orders, by request, and forget them (the harness and the model-less
        loops drain them after every schedule)."""
        orders = {o.request_id: o for o in self.orders}
        self.orders.clear()
        return orders

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return self.divergent_hits

    def saved_prefix(self, request: Any, limit: int) -> tuple[int, Any]:
        """The longest saved mamba boundary of `request`'s prompt within `limit` tokens: (tokens,
        its store entry (tokens, states)), (0, None) when none. A mamba layer resumes from its last state alone."""
        bs, unit = self.mamba_block_size, self.hash_block_size
        hashes = request.block_hashes
        for tokens in range(limit // bs * bs, 0, -bs):
            index = tokens // unit - 1
            if index < len(hashes):
                entry = self.store.get(bytes(hashes[index]))
                if entry is not None:
                    return tokens, entry
        return 0, None

    # ---- scheduler side ------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        if self.defer and self.defer.get(request.request_id):
            return self._deferral(request.request_id)
        hit = self.plan.get(request.request_id)
        if hit is None:
            return 0, False
        # Never the whole prompt: vLLM needs one token left to compute for a sync hit.
        limit = min(hit.tokens, request.num_prompt_tokens - 1)
        saved = None
        if self.load_saved:
            limit, saved = self.saved_prefix(request, limit)
        extra = max(0, limit - num_computed_tokens)
        self._matched[request.request_id] = (limit, saved)
        return extra, hit.load_async and extra > 0

    def _deferral(self, rid: str) -> tuple[None, bool]:
        """(None, False): the lookup is not known yet. vLLM 0.32 then skips the request for the rest of
        this schedule() (`skip_request`, scheduler.py:986-990 and 903-910), so a second lookup in the same
        schedule() breaks that rule (an endless loop in a scheduler that never moves past it)."""
        if self._last_deferral.get(rid) == self._schedules:
            raise SchedulerContractError(DEFERRED_REQUEST_SKIPPED, f"{rid}'s connector lookup was asked again in the "
                                         "schedule() in which it answered None: the deferred request was not skipped")
        self._last_deferral[rid] = self._schedules
        self.defer[rid] -= 1
        self.deferred.append(rid)
        return None, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            hit = self.plan[request.request_id]
            saved = self._matched.get(request.request_id, (0, None))[1]
            order = LoadOrder(request.request_id, num_external_tokens, hit.load_async, blocks.get_block_ids(), saved)
            self._step_orders.append(order)
            self.orders.append(order)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        self._schedules += 1
        if self.save_requests and self.offloads is not None:
            offloads = scheduler_session.boundary_state_offloads(scheduler_output)
            if offloads is None:
                self.offloads = None
            else:
                self.offloads += offloads
        meta = ScenarioConnectorMetadata(loads=self._step_orders)
        self._step_orders = []
        return meta

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        """Scheduler._connector_finished: a saving connector keeps the blocks (delay_free) until
        its worker reports the request in `finished_sending` (LMCache's and NIXL's
        `request_finished` answer True for a request whose blocks they still send)."""
        # NIXL's request_finished sends only a request that ran to its length cap (an aborted one
        # has nothing to hand off); a request's blocks are freed once, so one save each
        if not self.save_requests or request.status != RequestStatus.FINISHED_LENGTH_CAPPED:
            return False, None
        self.saves.append(SaveOrder(request.request_id, tuple(list(b) for b in block_ids),
                                    request.num_computed_tokens, tuple(bytes(h) for h in request.block_hashes)))
        return True, None

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return False, None

    # ---- worker side: unused, the harness simulates the runner -------------------------
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None


class ConnectorWorker:
    """The worker side of the scenario connector, which the harness plays: async loads in flight
    (request -> [forwards left, order, fails]), boundary-state hand-offs copied but not sent
    (request -> block hash -> [tokens, a state per mamba group]), and sends in flight (request ->
    [updates left, its entries]); each finished send fills the connector's `store`. All three
    stay empty under the default knobs (EngineConfig.connector_*). `connector` is None when the
    run has no prefix caching (a connector sees nothing then)."""

    def __init__(self, connector: ScenarioConnector | None, engine: Any, session: Any, events: list,
                 plan: dict[str, ExternalHit], defers: dict[str, int] | None = None):
        self.connector = connector
        self.engine = engine
        self.session = session
        self.events = events  # the trace's connector_events: (step, kind, request, detail)
        self.recv_pending: dict[str, list] = {}
        self.send_pending: dict[str, list] = {}
        self.async_loads = 0
        self.save_entries: dict[str, dict] = {}
        self.recv_tracked = bool(engine.connector_recv_steps or engine.connector_failed_load)
        self.sync_loads = 0  # synchronous loads vLLM asked for so far (connector_failed_sync_load counts them)
        if connector is not None:
            connector.plan = plan
            connector.defer = dict(defers or {})
            connector.save_requests, connector.load_saved = engine.connector_save, engine.connector_load_source == "saved"
            connector.mamba_block_size, connector.hash_block_size = engine.mamba_block_size, session.hash_block_size
            connector.divergent_hits = engine.connector_divergent_hits

    def busy(self) -> bool:
        """Transfers in flight: the engine core keeps stepping until they finish."""
        return bool(self.send_pending) or bool(self.recv_pending)

    def check_deferred(self, step: int, out: Any) -> None:
        """The requests whose lookup answered None in the schedule() that made `out` were skipped
        (DEFERRED_REQUEST_SKIPPED): none is scheduled in `out`, and none holds a block in any KV-cache
        group (vLLM skips the request before its allocation, scheduler.py:986-990)."""
        deferred, self.connector.deferred = self.connector.deferred, []
        for rid in deferred:
            left = self.connector.defer.get(rid, 0)
            self.events.append((step, "defer", rid, f"get_num_new_matched_tokens answered None ({left} more)"))
            if rid in out.num_scheduled_tokens:
                raise SchedulerContractError(DEFERRED_REQUEST_SKIPPED, f"step {step}: {rid} is scheduled "
                                             f"({out.num_scheduled_tokens[rid]} tokens) in the schedule() in which "
                                             "its connector lookup answered None (not known yet)")
            if self.session.holds_blocks(rid):
                raise SchedulerContractError(DEFERRED_REQUEST_SKIPPED, f"step {step}: {rid} holds blocks after the "
                                             "schedule() in which its connector lookup answered None: a deferred "
                                             "request is skipped before any allocation")

    def sync_load_fails(self, step: int, order: LoadOrder) -> bool:
        """Whether this synchronous load is the `connector_failed_sync_load`-th: the worker then writes
        nothing into its blocks and reports the request in `failed_recving` (alone: a sync load is never
        in `finished_recving`, whose handler asserts the request finished, scheduler.py:3224-3226)."""
        self.sync_loads += 1
        if self.sync_loads != self.engine.connector_failed_sync_load:
            return False
        self.events.append((step, "load-fail", order.request_id, f"{order.num_external_tokens} tokens, synchronous: "
                            "nothing written (failed_recving)"))
        return True

    def recv_progress(self, step: int, new: dict) -> tuple[dict, set[str]]:
        """One forward of the async loads in flight: `new` (this step's orders) start with
        `connector_recv_steps` forwards to go; a load with none left finishes now (the worker's
        `get_finished` reports it in `finished_recving`), and the `connector_failed_load`-th load
        fails (reported in `failed_recving` too: Scheduler._handle_failed_recving resets the
        request to recompute, _update_waiting_for_remote_kv frees or caches its blocks)."""
        e = self.engine
        for rid, order in new.items():
            self.async_loads += 1
            fails = self.async_loads == e.connector_failed_load
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
                self.events.append((step, "load-fail", rid, f"{order.num_external_tokens} tokens (failed_recving)"))
            else:
                self.events.append((step, "recv-done", rid, f"{order.num_external_tokens} tokens after "
                                    f"{e.connector_recv_steps + 1} forward(s)"))
        return done, failed

    def save_offloads(self, step: int, out: Any, live: dict, models: list) -> None:
        """The worker side of a saving connector, after the forward and its post-forward copies
        (`wait_for_save`): each boundary-state hand-off of this schedule (the scheduler names the
        exact block: `SchedulerOutput.kv_connector_block_state.boundary_state_offloads`) is copied
        holding what the kernel model of its mamba group says that block holds now, keyed as
        Mooncake's store keys it, by the request's block hash at the boundary; one entry holds
        every group's state (a store keeps each group's layers), and a load gives each group its
        own. Hand-offs of a request finished or preempted in this schedule are dropped, as
        Mooncake's and the CPU offload's schedulers do. The entries wait for the request's
        `request_finished` and reach the store when its send finishes, each only with a state for
        every group: a block holding the wrong state is a wrong entry (docs/REACH.md). `live` is the
        harness's requests (vLLM's Request as `.req`), `models` each mamba group's kernel model."""
        c = self.connector
        if c.offloads is None:
            c.offloads = []  # said once per run
            self.events.append((step, "save-unsupported", "-", scheduler_session.NO_BOUNDARY_STATE_OFFLOADS))
            c.save_requests = False
            return
        if not c.offloads:
            return
        offloads, c.offloads = c.offloads, []
        unit = self.session.hash_block_size
        null = self.session.null_block_id
        gone = self.session.preempted(out)
        groups = self.session.mamba_groups
        for rid, group, block, tokens in offloads:
            live_request = live.get(rid)
            if group not in groups or live_request is None:
                continue
            g = groups.index(group)
            req = live_request.req
            if tokens % unit:
                raise SchedulerContractError(OFFLOAD_ON_HASH_GRID, f"{rid}'s boundary-state hand-off of block {block} is "
                                             f"the state after {tokens} tokens, off the {unit}-token hash grid: a store "
                                             "connector has no prefix hash to key it by (Mooncake asserts)")
            index = tokens // unit - 1
            if req.is_finished() or rid in gone or block <= null or not 0 <= index < len(req.block_hashes):
                self.events.append((step, "offload-dropped", rid, f"block {block} at {tokens} tokens"))
                continue
            state = models[g].state_of(block)
            key = bytes(req.block_hashes[index])
            entry = self.save_entries.setdefault(rid, {}).setdefault(key, [tokens, [None] * len(models)])
            entry[1][g] = state
            if g == 0:  # the trace's group
                self.events.append((step, "save", rid, f"block {block} as the state after "
                                                    f"{tokens} tokens: holds {state}"))
            elif state != entry[1][0]:
                self.events.append((step, "save-group", rid, f"mamba group {g}'s block {block} "
                                                    f"as the state after {tokens} tokens: holds {state}"))

    def drain_saves(self, step: int) -> None:
        """Requests vLLM finished since the last drain whose blocks the connector keeps
        (delay_free): their saved entries are sent, `connector_send_steps` updates from now."""
        for order in self.connector.saves:
            entries = self.save_entries.pop(order.request_id, {})
            self.send_pending[order.request_id] = [self.engine.connector_send_steps, entries]
            self.events.append((step, "delay-free", order.request_id,
                                                f"request_finished keeps its blocks; {len(entries)} entries to send"))
        self.connector.saves.clear()

    def sends_finished(self, step: int) -> set[str]:
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
                    self.events.append((step, "save-incomplete", rid, f"the state after {tokens} "
                                                        f"tokens lacks mamba group(s) {[g for g, s in enumerate(states) if s is None]}"))
                    continue
                self.connector.store[key] = (tokens, tuple(states))
                stored += 1
            self.events.append((step, "sent", rid, f"{stored} mamba block(s) stored"))
        return done
