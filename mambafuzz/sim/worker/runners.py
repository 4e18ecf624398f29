"""The model runner's bookkeeping for one row: what it hands the mamba metadata builders, and
how it keeps each request's accepted-token count between steps.

vLLM 0.32 has two GPU model runners; they feed the same builders different row facts:

- V1: vllm/v1/worker/gpu_model_runner.py (+ vllm/v1/worker/mamba_utils.py);
- V2: vllm/v1/worker/gpu/model_runner.py + vllm/v1/worker/gpu/model_states/mamba_hybrid.py.

Which kernel a row then runs is the builder's decision (mambafuzz/sim/worker/mixers.py). The state copies
(pre-copy into a new column, post-copy of a crossed boundary) have the same semantics in both
runners (V2's fused kernels say they mirror V1's `preprocess_mamba`/`postprocess_mamba`), so
they live once, in mambafuzz/sim/worker/kernel_model.py.

Each runner's rules are one class here, registered in `RULES` under its name in
mambafuzz/model/runners.py; the kernel model asks `runner_rules` for them.
"""

from __future__ import annotations

from typing import NamedTuple

from mambafuzz.model import runners
from mambafuzz.sim.worker import v1_accepted_probe


class RowFacts(NamedTuple):
    """What the runner knows about one scheduled row."""

    num_computed: int  # tokens computed before this row
    num_scheduled: int  # tokens scheduled, drafts included
    num_drafts: int  # speculative tokens among them (-1 placeholders included)
    num_prompt_tokens: int
    prefill_len: int  # tokens the runner was handed at the request's last (re)admission (V2)


class BuilderInputs(NamedTuple):
    """The two per-row facts the GDN and Mamba2 metadata builders classify rows by."""

    is_prefilling: bool  # CommonAttentionMetadata.is_prefilling
    decode_drafts: int  # num_decode_draft_tokens_cpu: drafts of a decode row, -1 for any other row


class _ProbedV1Rule:
    """A class attribute read from vLLM's own V1 InputBatch (mambafuzz/sim/worker/v1_accepted_probe.py, cached
    per patch state) instead of a constant."""

    def __get__(self, obj: object, owner: type) -> bool:
        return v1_accepted_probe.resets_accepted_when_unscheduled()


class V1Runner:
    """Model Runner V1 (the default only with VLLM_USE_V2_MODEL_RUNNER=0 or without Triton)."""

    name = "v1"
    # gpu_model_runner.py `_update_states` drops every request not scheduled this step from the
    # persistent batch; vLLM 0.32's `InputBatch.add_request` (gpu_input_batch.py:479) re-adds it
    # with num_accepted_tokens_cpu = 1, while `mamba_state_idx` keeps its column. Asked of the
    # installed InputBatch, so a patch of it changes the answer.
    resets_accepted_when_unscheduled = _ProbedV1Rule()

    @staticmethod
    def builder_inputs(row: RowFacts, spec_engine: bool, num_speculative_tokens: int = 0) -> BuilderInputs:
        """gpu_model_runner.py `_build_attention_metadata`: is_prefilling = num_computed <
        num_prompt_tokens; `_prepare_inputs`: num_decode_draft_tokens = drafts when
        num_scheduled == drafts + 1, else 0 for a one-token row past its prompt
        (`zero_draft_decode_mask`), else -1. A padded one-token prompt (the scheduler's
        pad_spec_decode, drafts = [-1] * k) therefore counts as a decode row."""
        is_prefilling = row.num_computed < row.num_prompt_tokens
        if not spec_engine:
            return BuilderInputs(is_prefilling, -1)
        if row.num_drafts > 0 and row.num_scheduled == row.num_drafts + 1:
            return BuilderInputs(is_prefilling, row.num_drafts)
        if row.num_scheduled == 1 and row.num_computed >= row.num_prompt_tokens:
            return BuilderInputs(is_prefilling, 0)
        return BuilderInputs(is_prefilling, -1)


class V2Runner:
    """Model Runner V2 (what vLLM 0.32 picks on a CUDA host unless a feature rules it out)."""

    name = "v2"
    # mamba_hybrid.py keeps num_accepted_tokens_gpu per request slot; only scheduled rows are
    # updated (`postprocess_state`) and only a (re)added request is reset (`add_request`).
    resets_accepted_when_unscheduled = False

    @staticmethod
    def builder_inputs(row: RowFacts, spec_engine: bool, num_speculative_tokens: int = 0) -> BuilderInputs:
        """model_runner.py `gather_batch_req_state`: is_prefilling = computed prefill tokens <
        prefill_len (prompt plus any replayed outputs); `prefill_runs_as_decode` clears it for
        one new token over computed prefill tokens. mamba_hybrid.py `prepare_attn`: a row is a
        decode (num_decode_draft_tokens = its drafts) when it is not prefilling and schedules
        1..k+1 tokens, else -1. A padded one-token prompt with nothing computed stays a prefill."""
        computed = min(row.num_computed, row.prefill_len)
        is_prefilling = computed < row.prefill_len
        if is_prefilling and row.num_scheduled - row.num_drafts == 1 and computed > 0:
            is_prefilling = False  # prefill_runs_as_decode
        if not spec_engine:
            return BuilderInputs(is_prefilling, -1)
        if not is_prefilling and 0 < row.num_scheduled <= num_speculative_tokens + 1:
            return BuilderInputs(is_prefilling, row.num_drafts)
        return BuilderInputs(is_prefilling, -1)


RULES: dict[str, type] = {V1Runner.name: V1Runner, V2Runner.name: V2Runner}


def runner_rules(name: str) -> type:
    """The row-fact rules of the runner registered as `name`; an unknown name, or one without
    rules here, is a one-line UnknownRunner."""
    return runners.part_of(RULES, name, "kernel-model rules", "mambafuzz.sim.worker.runners.RULES")
