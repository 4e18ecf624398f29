"""Model Runner V1's "accepted count after a skipped step" rule, asked of vLLM's own code.

V1's `_update_states` (gpu_model_runner.py:1227-1233) drops every request not scheduled this
step from the persistent batch and re-adds it when it returns; vLLM 0.32's
`InputBatch.add_request` (gpu_input_batch.py:479) then restarts its `num_accepted_tokens_cpu` at
1. Instead of a constant, the kernel model (mambafuzz/sim/worker/runners.py) asks the installed `InputBatch`:
build a tiny one on CPU, add a request, set its accepted count, drop and re-add it as
`_update_states` does, read the count back. A patch of those methods (a candidate fix, a
planted bug) therefore changes the harness's verdict.

The answer is cached per identity of the probed functions (their code, wrapped code included),
so the probe runs once per process and patch state, not per scenario, step or re-application. Without the V1 batch (see
`vllm_compat.features.has_v1_accepted_probe`) the rule mirrored from vLLM 0.32 holds.
"""

from __future__ import annotations

from typing import Any

from mambafuzz.sim.bridge.vllm_compat import VllmUnsupported
from mambafuzz.sim.bridge.vllm_compat.features import V1_BATCH_METHODS, has_v1_accepted_probe

MIRRORED_RESET = True  # vLLM 0.32's V1 rule, used when the probe cannot run
PROBE_ACCEPTED = 2  # what postprocess_mamba leaves after a step that kept one draft in-block
PROBE_ID = "mambafuzz-probe"

_answers: dict[tuple[Any, ...], bool] = {}
probe_runs = 0  # probes run by this process (the cost check in tests/sim/test_runners.py)


def _probed() -> tuple[Any, ...] | None:
    """The functions the probe calls, as installed now (their identities key the cache); None when
    this vLLM has no V1 batch to ask."""
    try:
        from mambafuzz.sim.bridge.vllm_compat import api

        batch, state = api.InputBatch, api.CachedRequestState
    except VllmUnsupported:
        return None
    if not has_v1_accepted_probe(batch, state):
        return None
    return (batch, state, *(_identity(getattr(batch, m)) for m in V1_BATCH_METHODS))


def _identity(fn: Any, depth: int = 0) -> Any:
    """A function's code and, recursively, the code of the functions its closure wraps: equal for
    two applications of the same patch (each makes a new function object), different for a
    different patch, so re-applying a fix per replay does not re-run the probe."""
    code = getattr(fn, "__code__", None)
    if code is None or depth > 8:
        return fn
    inner = []
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(value):
            inner.append(_identity(value, depth + 1))
    return code, tuple(inner)


def probe_keeps_accepted() -> bool:
    """Run vLLM's V1 InputBatch through one skipped step: True when a re-added request keeps the
    accepted count it had when it was dropped."""
    from mambafuzz.sim.worker.v1_input_batch import cached_request, greedy_sampling, new_input_batch

    global probe_runs
    probe_runs += 1
    block_size = 16
    batch = new_input_batch(max_num_reqs=2, max_model_len=4 * block_size, max_num_batched_tokens=4 * block_size,
                            vocab_size=16, block_size=block_size, max_blocks=6, num_spec_tokens=1)

    def step(change) -> None:
        """One `_update_states`: the batch change, then condense() and refresh_metadata()."""
        change()
        batch.condense()
        batch.refresh_metadata()

    request = cached_request(PROBE_ID, block_size + 2, [0, 1], block_size + 2, greedy_sampling())
    step(lambda: batch.add_request(request))
    batch.num_accepted_tokens_cpu[batch.req_id_to_index[PROBE_ID]] = PROBE_ACCEPTED
    step(lambda: batch.remove_request(PROBE_ID))  # not scheduled this step: dropped
    step(lambda: batch.add_request(request))  # scheduled again: re-added
    return int(batch.num_accepted_tokens_cpu[batch.req_id_to_index[PROBE_ID]]) == PROBE_ACCEPTED


def resets_accepted_when_unscheduled() -> bool:
    """Whether Model Runner V1, as installed (patches included), restarts a request's accepted-
    token count at 1 when the request skipped a step."""
    key = _probed()
    if key is None:
        return MIRRORED_RESET
    answer = _answers.get(key)
    if answer is None:
        answer = _answers[key] = not probe_keeps_accepted()
    return answer


def rule_source() -> str:
    """Where the V1 rule comes from in this process, for messages and reports."""
    if _probed() is None:
        return "mirrored from vLLM 0.32 (this vLLM has no V1 InputBatch to probe)"
    return "probed from vLLM's V1 InputBatch"
