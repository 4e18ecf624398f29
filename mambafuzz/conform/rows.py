"""What one scheduled step hands the worker, and what the worker does with each row: plain data.

The conformance check (mambafuzz/conform/v1.py) fills `RowPlan`s by calling vLLM's own worker code;
a later adapter compares them with the kernel model's bookkeeping, step by step. Nothing here
imports vLLM, so the comparison side can use these types without paying for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PREFILL = "prefill"
DECODE = "decode"
SPEC_DECODE = "spec-decode"


@dataclass(frozen=True)
class RowInput:
    """One scheduled request as `SchedulerOutput` and the worker's request state describe it."""

    req_id: str
    num_computed: int  # num_computed_tokens before this step
    num_scheduled: int  # SchedulerOutput.num_scheduled_tokens[req_id], drafts included
    num_drafts: int  # len(SchedulerOutput.scheduled_spec_decode_tokens[req_id]) (-1 placeholders count)
    num_prompt_tokens: int
    block_ids: tuple[int, ...]  # the mamba group's block table for this request
    num_sampled: int = 1  # tokens the sampler keeps this step (1 + accepted drafts); sets num_accepted

    @property
    def samples(self) -> bool:
        """The row reaches the end of its prompt, so the sampler's tokens are kept (a chunk short
        of it is discarded: gpu_model_runner.py discard_request_mask, V2's post_update)."""
        return self.num_computed + self.num_scheduled - self.num_drafts >= self.num_prompt_tokens


@dataclass(frozen=True)
class StepInput:
    """One step: the scheduled rows in scheduler order and the requests the worker must forget."""

    rows: tuple[RowInput, ...]
    finished: frozenset[str] = frozenset()  # SchedulerOutput.finished_req_ids
    preempted: frozenset[str] = frozenset()  # SchedulerOutput.preempted_req_ids
    resumed: frozenset[str] = frozenset()  # scheduled_cached_reqs.resumed_req_ids


@dataclass(frozen=True)
class Write:
    column: int
    block: int
    cause: str  # "final" | "spec-token" | "checkpoint"


@dataclass(frozen=True)
class RowPlan:
    """What the worker did for one row in one step, for one runner and one mixer family.

    Columns index the request's mamba block table; blocks are physical ids (0 is the null block).
    `read_*` is where the kernel takes its initial state; `None` when it starts from zeros."""

    runner: str  # a name in mambafuzz.model.runners
    mixer: str  # "gdn" | "mamba2"
    req_id: str
    batch_row: int  # the row after the runner reordered its batch
    kind: str  # PREFILL | DECODE | SPEC_DECODE, as the mixer's metadata builder classified it
    has_initial_state: bool
    read_column: int | None
    read_block: int | None
    num_accepted: int  # the accepted-token count the kernel was given (1 outside spec rows)
    writes: tuple[Write, ...]
    checkpoint_offset: int = 0  # internal prefill checkpoint: offset into the query (0: none)
    pre_copies: tuple[tuple[int, int], ...] = field(default=())  # (src block, dst block) before the forward
    post_copies: tuple[tuple[int, int], ...] = field(default=())  # (src block, dst block) after it
