"""A real KV connector (KVConnectorBase_V1 + SupportsHMA) whose hits are scripted by the
scenario.  vLLM's connector factory loads it by module path; the harness hands it a plan
of external tokens per request and reads back which mamba block each load must fill.

It only plays the scheduler role: there are no workers, and the harness's kernel model
performs the "load" by writing the true state into the block vLLM gave the request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mambafuzz.sim.vllm_compat.api import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
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


@dataclass
class ScenarioConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadOrder] = field(default_factory=list)


class ScenarioConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.plan: dict[str, ExternalHit] = {}
        self.orders: list[LoadOrder] = []  # drained by the harness every step
        self._step_orders: list[LoadOrder] = []

    # ---- scheduler side ------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        hit = self.plan.get(request.request_id)
        if hit is None:
            return 0, False
        # Never the whole prompt: vLLM needs one token left to compute for a sync hit.
        extra = max(0, min(hit.tokens, request.num_prompt_tokens - 1) - num_computed_tokens)
        return extra, hit.load_async and extra > 0

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            hit = self.plan[request.request_id]
            order = LoadOrder(request.request_id, num_external_tokens, hit.load_async, blocks.get_block_ids())
            self._step_orders.append(order)
            self.orders.append(order)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = ScenarioConnectorMetadata(loads=self._step_orders)
        self._step_orders = []
        return meta

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        return False, None

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
