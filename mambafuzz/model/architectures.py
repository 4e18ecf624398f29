"""The hybrid architectures a scenario's `engine.model` names, registered once.

Each entry is the layer layout of a full-size published model, the vLLM class that serves it,
its mixer family (mambafuzz/sim/worker/mixers.py) and the config fields vLLM's own state-shape
function reads. The vLLM-facing KV-cache specs are built from these in
mambafuzz/sim/bridge/architectures.py. Imports nothing from vLLM: validation and `--help` read it.

The layouts and numbers below are written from the published Hugging Face configs as remembered
(field names given per entry), not downloaded; the layer COUNTS are what decides vLLM's grouping.

Align mode in vLLM 0.32: every `IsHybrid` model gets `HybridAttentionMambaModelConfig.
verify_and_update_config` (config/vllm.py, `try_verify_and_update_config`), which sets
`mamba_cache_mode = "align"` whenever prefix caching is on (MambaModelConfig.verify_and_update_config,
model_executor/models/config.py); `supports_mamba_prefix_caching` (models/interfaces.py) is recorded
in the registry's model info but nothing in 0.32 reads it, so align mode is not gated per model.
Registered here: the hybrids whose layer kinds the bridge can build (full attention, GDN, Mamba2).
Left out: Jamba (Mamba1 mixer: no Mamba1 rules in the kernel model), Zamba2 (shared attention
blocks reused across layers), LFM2 (short-conv mixer), Olmo-hybrid, Bailing, MiniMax (linear
attention mixers the kernel model has no rules for).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_MODEL = "tiny_qwen3_next"

# layer kinds of a layout string
MAMBA = "M"  # a mamba layer of the architecture's mixer family
ATTENTION = "A"  # full attention
SLIDING = "S"  # sliding-window attention
PARALLEL = "P"  # attention and mamba side by side in one decoder layer (Falcon-H1)


class UnknownModel(ValueError):
    """A model name nothing is registered for (one line)."""


@dataclass(frozen=True)
class Architecture:
    name: str  # engine.model
    title: str  # what the trace header and reports call it
    vllm_class: str  # model_executor/models registry name
    mixer: str  # "gdn" | "mamba2"
    layout: str  # one letter per decoder layer (MAMBA, ATTENTION, SLIDING, PARALLEL)
    num_kv_heads: int
    head_dim: int
    # the fields the vLLM class's get_mamba_state_shape_from_config reads from its hf config
    state_config: Mapping[str, int] = field(default_factory=dict)
    mtp_layers: int = 0  # the drafter's own decoder layers (num_nextn_predict_layers / mtp_num_hidden_layers)
    # mamba KV-cache groups vLLM's uniform-page grouping makes of the layout (with and without the drafter's
    # layers): declared for the pool sizing at the model layer, checked against vLLM by tests/sim/test_architecture_specs.py
    mamba_groups: int = 0
    # the block size vLLM 0.32 runs it with in align mode without spec decode (Platform._align_hybrid_block_size
    # for its real state; mambafuzz/sim/bridge/architectures.py `align_block_size`, checked by the same tests); 0: not known
    vllm_block_size: int = 0
    sliding_window: int | None = None

    def count(self, kind: str) -> int:
        return self.layout.count(kind) + (self.layout.count(PARALLEL) if kind in (MAMBA, ATTENTION) else 0)


def _interval(num_layers: int, full_attention_interval: int) -> str:
    """Qwen3-Next / Qwen3.5 `layer_types`: every `full_attention_interval`-th layer is full attention."""
    return "".join(ATTENTION if (i + 1) % full_attention_interval == 0 else MAMBA for i in range(num_layers))


def _nemotron(pattern: str) -> str:
    """Nemotron-H `hybrid_override_pattern`: M mamba2, * attention, - MLP (no KV cache), E MoE."""
    return "".join({"M": MAMBA, "*": ATTENTION}.get(c, "") for c in pattern)


_QWEN3_NEXT_GDN = dict(linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                       linear_value_head_dim=128, linear_conv_kernel_dim=4)

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    # mambafuzz/tiny_model/config.json: what every scenario ran before the knob (bridge keeps its own specs)
    Architecture(DEFAULT_MODEL, "tiny qwen3_next (3 GDN + 1 attention)", "Qwen3NextForCausalLM", "gdn",
                 "MMMA", num_kv_heads=2, head_dim=64, mamba_groups=3),
    # Qwen3-Next-80B-A3B: num_hidden_layers 48, full_attention_interval 4, num_key_value_heads 2, head_dim 256,
    # linear_* as below, num_nextn_predict_layers 1
    Architecture("qwen3_next_80b", "Qwen3-Next-80B-A3B", "Qwen3NextForCausalLM", "gdn", _interval(48, 4),
                 num_kv_heads=2, head_dim=256, state_config=_QWEN3_NEXT_GDN, mtp_layers=1, mamba_groups=3,
                 vllm_block_size=544),
    # Qwen3.5-397B-A17B (text config): num_hidden_layers 60, full_attention_interval 4, num_key_value_heads 2,
    # head_dim 256, linear_num_value_heads 64, linear_num_key_heads 16, key/value head dim 128, mtp_num_hidden_layers 1
    Architecture("qwen3_5_397b", "Qwen3.5-397B-A17B", "Qwen3_5MoeForCausalLM", "gdn", _interval(60, 4),
                 num_kv_heads=2, head_dim=256, state_config=dict(_QWEN3_NEXT_GDN, linear_num_value_heads=64),
                 mtp_layers=1, mamba_groups=3, vllm_block_size=1072),
    # Nemotron-H-8B-Base-8K: hybrid_override_pattern (52 layers: 24 M, 4 *, 24 -), num_key_value_heads 8,
    # head_dim 128 (hidden_size 4096 / 32 heads), mamba_num_heads 128, mamba_head_dim 64, ssm_state_size 128,
    # n_groups 8, conv_kernel 4
    Architecture("nemotron_h_8b", "Nemotron-H-8B", "NemotronHForCausalLM", "mamba2",
                 _nemotron("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"),
                 num_kv_heads=8, head_dim=128,
                 state_config=dict(mamba_num_heads=128, mamba_head_dim=64, ssm_state_size=128, n_groups=8,
                                   conv_kernel=4), mamba_groups=6, vllm_block_size=528),
    # granite-4.0-h-small: num_hidden_layers 40, layer_types "attention" at 5, 15, 25, 35 and "mamba" elsewhere,
    # hidden_size 4096, num_attention_heads 32, num_key_value_heads 8, mamba_expand 2, mamba_n_heads 128,
    # mamba_d_head 64, mamba_d_state 128, mamba_n_groups 1, mamba_d_conv 4
    Architecture("granite_4_0_h_small", "Granite-4.0-H-Small", "GraniteMoeHybridForCausalLM", "mamba2",
                 "".join(ATTENTION if i in (5, 15, 25, 35) else MAMBA for i in range(40)),
                 num_kv_heads=8, head_dim=128,
                 state_config=dict(hidden_size=4096, mamba_expand=2, mamba_n_heads=128, mamba_d_head=64,
                                   mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4), mamba_groups=9, vllm_block_size=528),
    # Falcon-H1-7B: num_hidden_layers 44, every decoder layer runs attention and Mamba2 in parallel
    # (FalconH1ParallelHybrid), hidden_size 3072, num_key_value_heads 2, head_dim 128, mamba_d_ssm 3072,
    # mamba_n_heads 24, mamba_d_head 128, mamba_d_state 256, mamba_n_groups 1, mamba_d_conv 4
    Architecture("falcon_h1_7b", "Falcon-H1-7B", "FalconH1ForCausalLM", "mamba2", PARALLEL * 44,
                 num_kv_heads=2, head_dim=128,
                 state_config=dict(hidden_size=3072, mamba_expand=2, mamba_d_ssm=3072, mamba_n_heads=24,
                                   mamba_d_head=128, mamba_d_state=256, mamba_n_groups=1, mamba_d_conv=4), mamba_groups=1, vllm_block_size=1568),
)}

MODELS: tuple[str, ...] = tuple(ARCHITECTURES)


def get(name: str) -> Architecture:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise UnknownModel(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
