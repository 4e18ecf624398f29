"""Which kernel path a row takes, per mixer family: the metadata builder's classification.

Two paths matter for what a forward reads and writes (mambafuzz/sim/worker/kernel_model.py runs them):

- SPEC: the multi-token decode kernel. It starts from column `num_accepted - 1` of the row's
  state indices and stores the state after token t in column t. No initial-state mask: a
  row with nothing computed still loads whatever its block holds.
  GDN: fla `fused_sigmoid_gating_delta_rule_update` with `num_accepted_tokens`
  (third_party/flash_linear_attention/ops/fused_sigmoid_gating.py); Mamba2:
  `selective_state_update` with `num_accepted_tokens` and `dst_state_batch_indices`
  (model_executor/layers/mamba/ops/mamba_ssm.py).
- PREFILL: the chunked kernel. It starts from column 0 of the state indices, zeroed where
  `has_initial_state` (computed tokens > 0) is false, and stores only the final state there,
  drafts included (it cannot roll back rejected tokens). GDN: `chunk_gated_delta_rule`
  (qwen_gdn_linear_attn.py `initial_state[~prefill_has_initial_state] = 0`,
  `ssm_state[prefill_state_indices] = last_recurrent_state`); Mamba2: `mamba_chunk_scan_combined`
  (mamba_mixer2.py `torch.where(has_initial_states_p, ...)`, `ssm_state[state_indices_tensor_p] =
  final_states`). A plain one-token decode outside a spec-decode engine starts from column 0
  and stores there too, so it shares this path.
"""

from __future__ import annotations

from mambafuzz.sim.worker.runners import BuilderInputs

SPEC = "spec"
PREFILL = "prefill"
MIXERS = ("gdn", "mamba2")


class GDN:
    """Gated DeltaNet (Qwen3-Next, Qwen3.5): v1/attention/backends/gdn_attn.py."""

    name = "gdn"

    @staticmethod
    def path(inputs: BuilderInputs, num_computed: int, num_scheduled: int, spec_engine: bool,
             num_speculative_tokens: int) -> str:
        """`GDNAttentionMetadataBuilder.build`: `spec_sequence_masks_cpu =
        num_decode_draft_tokens_cpu >= 0`; every other row runs the chunked kernel, or the
        non-spec recurrent kernel from column 0 (rows with no prior state are routed to the
        chunked kernel by `no_prior_state`, which is what has_initial_state would do)."""
        return SPEC if spec_engine and inputs.decode_drafts >= 0 else PREFILL


class Mamba2:
    """Mamba2 (Nemotron-H style): v1/attention/backends/mamba_attn.py (mamba2_attn.py builds on it)."""

    name = "mamba2"

    @staticmethod
    def path(inputs: BuilderInputs, num_computed: int, num_scheduled: int, spec_engine: bool,
             num_speculative_tokens: int) -> str:
        """`BaseMambaAttentionMetadataBuilder._compute_common_metadata`: a prefilling row with
        prior state becomes a decode when it schedules one token or is a padded prompt tail
        (`num_decode_draft_tokens_cpu >= 0` and query = drafts + 1); then
        `split_decodes_and_prefills(treat_short_extends_as_decodes=False)` makes every
        non-prefilling row of at most `reorder_batch_threshold` tokens (1 + k in a spec-decode
        engine) a decode. Decodes run the multi-token kernel only in a spec-decode engine.
        Unmodelled: the split assumes the runner's reorder put decodes first."""
        is_prefilling = inputs.is_prefilling
        if is_prefilling and num_computed > 0 and (
                num_scheduled == 1
                or (inputs.decode_drafts >= 0 and num_scheduled == inputs.decode_drafts + 1)):
            is_prefilling = False
        threshold = 1 + num_speculative_tokens if spec_engine else 1
        decode = not is_prefilling and num_scheduled <= threshold
        return SPEC if decode and spec_engine else PREFILL


def mixer_rules(name: str) -> type[GDN] | type[Mamba2]:
    if name == "gdn":
        return GDN
    if name == "mamba2":
        return Mamba2
    raise ValueError(f"unknown mixer family {name!r} (one of {', '.join(MIXERS)})")
