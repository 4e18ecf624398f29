"""Candidate fix: a request preempted after schedule() gave it blocks this step has the blocks keyed
for its unscheduled chunk evicted from the prefix cache before they are freed.

Why: `allocate_slots` keys full blocks up to num_computed + num_new_tokens before the forward that
computes them (v1/core/kv_cache_manager.py:606-616). Under `scheduling_policy="priority"` the running
loop may preempt a request it already scheduled this step (the largest (priority, arrival_time),
sched/scheduler.py:795-833, which takes the request back out of `scheduled_running_reqs`); its
chunk never runs, but `_preempt_request` frees its blocks with their keys (`free_blocks` keeps a
freed block's hash), so a later lookup, the request's own re-admission included, is served blocks
no forward wrote. The wrap evicts, before the free, every block in the request's tables whose key
claims more tokens than the request has computed (`num_computed_tokens` is not advanced before
schedule() returns).
"""

from __future__ import annotations

from mambafuzz.sim.patching import Wrap

TARGET = "vllm.v1.core.sched.scheduler:Scheduler._preempt_request"


def _evict_unscheduled_keys(original):
    def _preempt_request(self, request, *args, **kwargs):
        manager = self.kv_cache_manager
        pool = manager.block_pool
        computed = request.num_computed_tokens
        for group in manager.coordinator.single_type_managers:
            for column, block in enumerate(group.req_to_blocks.get(request.request_id, ())):
                if block.is_null or block.block_hash is None:
                    continue
                claims = block.block_hash_num_tokens or (column + 1) * group.block_size
                if claims > computed:
                    pool._maybe_evict_cached_block(block)
        return original(self, request, *args, **kwargs)
    return _preempt_request


PATCHES = [Wrap(TARGET, _evict_unscheduled_keys)]
