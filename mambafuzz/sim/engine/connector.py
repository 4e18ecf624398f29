"""A real KV connector (KVConnectorBase_V1 + SupportsHMA) whose hits are scripted by the
scenario.  vLLM's connector factory loads it by module path; the harness hands it a plan
of external tokens per request and reads back which mamba block each load must fill.

It only plays the scheduler role: there are no workers, and the harness's kernel model
performs the "load" by writing a state into the block vLLM gave the request, and the "save"
by reading the blocks the scheduler names in `SchedulerOutput.kv_connector_block_state.
boundary_state_offloads` (collected here in `build_connector_meta`, the one place a connector
sees them), after that step's forward, as vLLM's offloading connectors copy them (the harness's
`_save_offloads`; docs/REACH.md "What a saving connector stores").

Beyond the default (load the true state, in one step, never save), the engine's `connector_*`
knobs give it the scheduler side of the saving connectors (LMCache, NIXL, both in
vllm/distributed/kv_transfer/kv_connector/v1/): `request_finished_all_groups` answers
delay_free=True for a request it saves, and the harness reports `finished_sending` later
(Scheduler._update_from_kv_xfer_finished frees the blocks then); loads can deliver what was
saved under the prompt's block hashes (`store`) instead of the truth.
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

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            hit = self.plan[request.request_id]
            saved = self._matched.get(request.request_id, (0, None))[1]
            order = LoadOrder(request.request_id, num_external_tokens, hit.load_async, blocks.get_block_ids(), saved)
            self._step_orders.append(order)
            self.orders.append(order)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
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
