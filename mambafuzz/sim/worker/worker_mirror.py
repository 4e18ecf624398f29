"""What the GPU worker does with one SchedulerOutput, replayed on kernel models.

scheduler output (+ the model runner's answer) -> (this module) -> kernel models.  The harness
(mambafuzz/sim/engine/harness.py, reading through mambafuzz.sim.bridge.scheduler_session's SchedulerSession) and the runtime audit
plugin (mambafuzz/engine_tier/audit_plugin.py, reading a live Scheduler) both apply a step through
it, so the two cannot drift apart.  Callers hand over plain data: request ids, block tables,
token counts and the request's truth (mambafuzz.sim.state.PrefixStates).

It reads a SchedulerOutput by attribute only and imports neither vLLM nor the kernel model:
the audit plugin loads it inside a serving vLLM process.  One KernelModel per mamba KV-cache
group (the harness watches one group, the plugin every group); a call returns what the first
model did, for the caller's trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mambafuzz.sim.bridge.vllm_compat.output import resumed_req_ids

if TYPE_CHECKING:
    from mambafuzz.sim.state import PrefixStates, State
    from mambafuzz.sim.worker.kernel_model import KernelModel, RowRead, RowResult


def dropped_requests(out: Any) -> set[str]:
    """Requests whose worker-side running-state index is forgotten this step
    (vllm/v1/worker/mamba_utils.py:cleanup_mamba_state_idx)."""
    dropped = set(out.finished_req_ids)
    if out.preempted_req_ids:
        dropped.update(out.preempted_req_ids)
    dropped.update(resumed_req_ids(out))
    return dropped


def block_copies(out: Any) -> list[tuple[int, int]]:
    """The CoW copies (src, dst) the worker applies before the forward."""
    return [(c.src_block_id, c.dst_block_id) for c in (out.kv_cache_block_copies or ())]


def accepted_count(sampled: Sequence[int] | None) -> int:
    """Tokens a row kept this step, as the worker counts them for post-processing: at least 1."""
    return max(len(sampled) if sampled else 0, 1)


def extend_truth(truth: PrefixStates, req: Any) -> PrefixStates:
    """Append the tokens vLLM's Request gained since `truth` last saw it (prompt, sampled)."""
    have = len(truth.tokens)
    num_tokens = req.num_tokens
    if num_tokens > have:
        truth.append(req.all_token_ids[have:num_tokens])
    return truth


class WorkerMirror:
    """The worker's side of a step, on one kernel model per mamba group.

    Order of a step (the worker's): `before_forward` (forget dropped requests, zero fresh
    blocks, CoW copies), connector loads that landed at admission (`load`), `begin_step`, one
    `run_row` per scheduled row, then after the forward `postprocess` with each row's accepted
    count (spec decode) and `load` for asynchronous loads that finished.  `tables` arguments
    hold the request's block table of each model's group, in model order."""

    __slots__ = ("models", "first", "rest", "spec", "rest_reads", "_same_kernels", "_lockstep", "_own")

    def __init__(self, models: Sequence[KernelModel], spec_engine: bool):
        self.models = tuple(models)
        self.first = self.models[0]
        self.rest = self.models[1:]
        self.spec = spec_engine
        # what the other models' rows of the last run_row read, in model order (RowRead: their fields of a RowResult)
        self.rest_reads: Sequence[RowRead | RowResult] = ()
        first = self.first
        self._same_kernels = [type(m.runner) is type(first.runner) and type(m.mixer) is type(first.mixer)
                              and m.g.spec_engine == first.g.spec_engine
                              and m.g.num_speculative_tokens == first.g.num_speculative_tokens for m in self.rest]
        # Groups that all have the first group's geometry, runner and mixer (the harness's) have its columns,
        # counts and row kinds: they follow the first model's bookkeeping, and the first model runs their rows
        # with its own (KernelModel.run_rows). Otherwise each model runs on its own.
        self._lockstep = all(same and m.g == first.g for m, same in zip(self.rest, self._same_kernels))
        if self._lockstep:
            for model in self.rest:
                model.follow(first)
        self._own = (first,) if self._lockstep else self.models  # the models that keep their own counts

    def before_forward(self, out: Any) -> Sequence[tuple[int, State]]:
        """Apply what precedes the forward; returns (dst, state the first model holds after the
        copies) per CoW copy, in order. Starts the forward (`KernelModel.begin_forward`)."""
        rows = len(out.num_scheduled_tokens)
        for model in self.models:
            model.begin_forward(rows)
        dropped = dropped_requests(out)
        zero = out.new_block_ids_to_zero
        if dropped:
            for model in self._own:
                model.forget_requests(dropped)
        if zero:
            for model in self.models:
                model.zero_blocks(zero)
        if not out.kv_cache_block_copies:
            return ()
        copies = block_copies(out)
        for model in self.models:
            model.copy_blocks(copies)
        return [(dst, self.first.state_of(dst)) for _, dst in copies]

    def load(self, tables: Sequence[list[int]], num_tokens: int, state: State,
             rest_states: Sequence[State] | None = None) -> int:
        """A connector load of the state after `num_tokens`; returns the first model's block. Each
        other model loads `state` too, or its own entry of `rest_states` (a saved entry holds one
        state per mamba group, as a store keeps each group's layers)."""
        if self.rest:
            for i, (model, table) in enumerate(zip(self.rest, tables[1:])):
                model.load_external(table, num_tokens, state if rest_states is None else rest_states[i])
        return self.first.load_external(tables[0], num_tokens, state)

    def begin_step(self, scheduled: dict[str, int]) -> list[str]:
        """Before the rows; returns the requests whose accepted count the first model reset."""
        for model in self._own[1:]:
            model.begin_step(scheduled)
        return self.first.begin_step(scheduled)

    def run_row(self, rid: str, tables: Sequence[list[int]], start: int, n: int, drafts: list[int],
                truth: PrefixStates, num_prompt_tokens: int, prefill_len: int) -> tuple[bool, RowResult]:
        """One scheduled row: `n` tokens from `start`, the last `len(drafts)` of them drafts.
        Returns (whether the first model ran it as a spec row, its RowResult)."""
        num_drafts = len(drafts)
        tokens = truth.tokens[start:start + n - num_drafts]  # a fresh list
        if drafts:
            tokens += drafts
        spec = self.spec
        first = self.first
        spec_row = spec and first.is_spec_row(start, n, num_drafts, num_prompt_tokens, prefill_len)
        if self._lockstep:
            rows = first.run_rows(rid, tables, start, tokens, num_drafts, spec_row, truth, self.rest)
            if self.rest:
                self.rest_reads = rows[1:]
            return spec_row, rows[0]
        if self.rest:  # a group with the first group's runner and mixer classifies the row alike
            self.rest_reads = [model.run_row(rid, table, start, tokens, num_drafts,
                                             spec_row if self._same_kernels[i] else
                                             spec and model.is_spec_row(start, n, num_drafts, num_prompt_tokens,
                                                                        prefill_len), truth, sample=False)
                               for i, (model, table) in enumerate(zip(self.rest, tables[1:]))]
        return spec_row, first.run_row(rid, tables[0], start, tokens, num_drafts, spec_row, truth)

    def postprocess(self, rid: str, tables: Sequence[list[int]], start: int, n: int, num_drafts: int,
                    accepted: int) -> list[tuple[int, int, State, str]]:
        """After a spec-decode forward: every row, with its accepted count; the first model's writes."""
        if self.rest:
            for model, table in zip(self.rest, tables[1:]):
                model.postprocess_spec(rid, table, start, n, num_drafts, accepted)
        return self.first.postprocess_spec(rid, tables[0], start, n, num_drafts, accepted)
