"""Each request's block tables as vLLM's GPU worker knows them: built from SchedulerOutput alone.

A worker never reads the scheduler's state. vLLM 0.32's Model Runner V1 (`_update_states`,
v1/worker/gpu_model_runner.py:1417-1428) takes a new request's `NewRequestData.block_ids`, appends
`CachedRequestData.new_block_ids` to a running request's table, and replaces the table only for a
request in `resumed_req_ids`; it forgets a request in `finished_req_ids` and keeps a preempted
one's state until it is resumed. Model Runner V2 (v1/worker/gpu/model_runner.py:1152-1247) appends
through `BlockTables.append_block_ids(..., overwrite=False)`, forgets preempted requests with the
finished ones (`finish_requests`) and gets a resumed request back as a new one.

So a scheduler that changes a block in a running request's table without saying so computes, on
a real GPU, on a table it does not know. The harness runs the kernel model on these tables and
holds them against the manager's (worker_contract.check_told_blocks). Reads a SchedulerOutput by attribute
only and imports no vLLM: the conformance driver builds its rows from it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mambafuzz.model import runners as model_runners
from mambafuzz.sim.bridge.vllm_compat.output import resumed_req_ids


class UntoldRequest(Exception):
    """A SchedulerOutput names a running request the worker holds no table for: vLLM's worker
    raises a KeyError (V1 `self.requests[req_id]`, V2 `req_id_to_index`)."""


class WorkerTables:
    """The block tables of every request the worker holds, per watched KV-cache group: `groups`
    (the kernel models' mamba groups, `get`) and, read from the same pass over each output,
    `side_groups` (the attention groups whose contents the harness tracks, `get_side`)."""

    __slots__ = ("groups", "side_groups", "forgets_preempted", "_tables", "_side", "computed")

    def __init__(self, groups: Sequence[int], runner: str, side_groups: Sequence[int] = ()):
        self.groups = tuple(groups)  # the KV-cache groups kept, in the caller's order (the kernel models')
        self.side_groups = tuple(side_groups)
        # V2 (`use_v2_model_runner`, which also makes the scheduler send a resumed request as a new one)
        # forgets a preempted request in `finish_requests`; V1 keeps `self.requests[req_id]` to resume it
        self.forgets_preempted = model_runners.get(runner).use_v2_model_runner
        self._tables: dict[str, tuple[list[int], ...]] = {}
        self._side: dict[str, tuple[list[int], ...]] = {}  # empty unless side_groups
        # each request of the last output: the tokens it says are computed before its row
        # (NewRequestData/CachedRequestData.num_computed_tokens, which the worker takes as its row's start)
        self.computed: dict[str, int] = {}

    def update(self, out: Any) -> None:
        """Apply one SchedulerOutput, in the worker's order: finished (and, for V2, preempted)
        requests go, new ones come with their whole tables, cached ones append or, resumed, replace."""
        tables, groups = self._tables, self.groups
        side_groups = self.side_groups
        side = self._side if side_groups else None
        for rid in out.finished_req_ids:
            tables.pop(rid, None)
            if side is not None:
                side.pop(rid, None)
        if self.forgets_preempted and out.preempted_req_ids:
            for rid in out.preempted_req_ids:
                tables.pop(rid, None)
                if side is not None:
                    side.pop(rid, None)
        computed = self.computed = {}
        for new in out.scheduled_new_reqs:
            ids = new.block_ids
            tables[new.req_id] = tuple([*ids[g]] for g in groups)
            if side is not None:
                side[new.req_id] = tuple([*ids[g]] for g in side_groups)
            computed[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        if not cached.req_ids:
            return
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        resumed = resumed_req_ids(out)
        for rid, ids in zip(cached.req_ids, cached.new_block_ids):
            if rid in resumed:
                if ids is None:  # V1 asserts it (`assert new_block_ids is not None`)
                    raise UntoldRequest(f"{rid} is resumed with no block table")
                tables[rid] = tuple([*ids[g]] for g in groups)
                if side is not None:
                    side[rid] = tuple([*ids[g]] for g in side_groups)
                continue
            own = tables.get(rid)
            if own is None:
                raise UntoldRequest(f"{rid} is scheduled as a running request but the worker never got it "
                                    "as a new one (or forgot it when it was finished or preempted)")
            if ids is not None:
                for table, g in zip(own, groups):
                    table.extend(ids[g])
                if side is not None:
                    for table, g in zip(side[rid], side_groups):
                        table.extend(ids[g])

    def get(self, rid: str) -> tuple[list[int], ...] | None:
        """The request's tables, in `groups` order (the worker's own lists: do not change them)."""
        return self._tables.get(rid)

    def get_side(self, rid: str) -> tuple[list[int], ...] | None:
        """The request's tables in `side_groups` order (the worker's own lists: do not change them)."""
        return self._side.get(rid)

    def __contains__(self, rid: str) -> bool:
        return rid in self._tables
