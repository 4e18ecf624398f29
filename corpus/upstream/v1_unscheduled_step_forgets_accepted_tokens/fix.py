"""Candidate fix: Model Runner V1 keeps a request's accepted-token count while the request sits
out a step, as Model Runner V2 does (mamba_hybrid.py keeps it per request slot).

Why: `GPUModelRunner._update_states` drops every request not scheduled this step from the
persistent batch and re-adds it when it returns; `InputBatch.add_request` then restarts
`num_accepted_tokens_cpu` at 1 (gpu_input_batch.py:479) while `mamba_state_idx` keeps the
column whose state is `num_accepted - 1` tokens in, so the next spec-decode row reads a state
short by the forgotten tokens. The fix parks the count when `remove_request` drops a row and
restores it when `add_request` re-adds the same request. A request resumed after preemption
(or finished) starts over, as V2's `add_request` does: `preprocess_mamba` already forgets its
`mamba_state_idx`, and now also its parked and restored count.
Wraps of three installed functions; each stops applying (and says so) when its target is gone.
"""

from __future__ import annotations

import functools
import itertools

from mambafuzz.sim.patching import Wrap

PARKED = "_parked_num_accepted_tokens"  # InputBatch attribute: req_id -> count at removal


def _parked(batch) -> dict:
    if not hasattr(batch, PARKED):
        setattr(batch, PARKED, {})
    return getattr(batch, PARKED)


def park_on_remove(remove_request):
    @functools.wraps(remove_request)
    def fixed(self, req_id, *args, **kwargs):
        index = self.req_id_to_index.get(req_id)
        if index is not None:
            _parked(self)[req_id] = int(self.num_accepted_tokens_cpu[index])
        return remove_request(self, req_id, *args, **kwargs)
    return fixed


def restore_on_add(add_request):
    @functools.wraps(add_request)
    def fixed(self, request, *args, **kwargs):
        index = add_request(self, request, *args, **kwargs)
        count = _parked(self).pop(request.req_id, None)
        if count is not None:
            self.num_accepted_tokens_cpu[self.req_id_to_index[request.req_id]] = count
        return index
    return fixed


def forget_on_restart(preprocess_mamba):
    @functools.wraps(preprocess_mamba)
    def fixed(scheduler_output, kv_cache_config, cache_config, mamba_state_idx, input_batch, *args, **kwargs):
        parked = _parked(input_batch)
        resumed = scheduler_output.scheduled_cached_reqs.resumed_req_ids
        for req_id in itertools.chain(scheduler_output.finished_req_ids,
                                      scheduler_output.preempted_req_ids or (), resumed):
            parked.pop(req_id, None)
        for req_id in resumed:
            index = input_batch.req_id_to_index.get(req_id)
            if index is not None:
                input_batch.num_accepted_tokens_cpu[index] = 1
        return preprocess_mamba(scheduler_output, kv_cache_config, cache_config, mamba_state_idx, input_batch,
                                *args, **kwargs)
    return fixed


PATCHES = [
    Wrap("vllm.v1.worker.gpu_input_batch:InputBatch.remove_request", park_on_remove),
    Wrap("vllm.v1.worker.gpu_input_batch:InputBatch.add_request", restore_on_add),
    Wrap("vllm.v1.worker.mamba_utils:preprocess_mamba", forget_on_restart),
]
