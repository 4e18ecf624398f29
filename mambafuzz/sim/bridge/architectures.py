"""The vLLM KV-cache specs of a registered architecture (mambafuzz/model/architectures.py), grouped by vLLM.

Per layer, the spec vLLM's model runner collects (v1/worker/gpu_model_runner.py `get_kv_cache_spec`: every
attention and mamba layer of the static forward context, the drafter's layers included):
- a mamba layer: `MambaSpec` with the state shapes and dtypes of the model class's own
  `get_mamba_state_shape_from_config` / `get_mamba_state_dtype_from_config`, called here with a config
  object (no weights). Where the class cannot be imported on this host (Qwen3.5: qwen3_5.py imports
  qwen3_vl, whose image processor needs torchvision), the same `MambaStateShapeCalculator` /
  `MambaStateDtypeCalculator` call the classmethod makes is made directly (`state_source` says which);
- an attention layer: `FullAttentionSpec` (`SlidingWindowSpec` for a sliding-window layer,
  attention/layer.py `Attention.get_kv_cache_spec`);
- the MTP drafter's decoder layers (qwen3_next_mtp.py / qwen3_5_mtp.py: `layer_type="full_attention"`
  under the `mtp.layers.{i}` prefix): one more full-attention layer each, with a spec-decode engine.

The groups are vLLM's own `_get_kv_cache_groups_uniform_page_size` over those specs. Its precondition
(one page size) is met the way the platform meets it (platforms/interface.py `_align_hybrid_block_size`):
every page padded to the largest. What vLLM then also does, raise the block size to
`align_block_size(...)` tokens so the attention page holds the real mamba state, is reported, not applied:
the scenario's block sizes stay the geometry the scheduler runs with (docs/SCENARIO_FORMAT.md).
"""

from __future__ import annotations

import dataclasses
import types
from functools import lru_cache

import torch

from mambafuzz.model import architectures as registry
from mambafuzz.model.architectures import ATTENTION, MAMBA, PARALLEL, SLIDING, Architecture
from mambafuzz.sim.bridge.vllm_compat import api
from mambafuzz.sim.bridge.vllm_compat.resolve import VllmUnsupported

MODEL_DTYPE = torch.bfloat16  # the published checkpoints' torch_dtype
# The smallest kernel block FlashAttention takes (its `get_supported_kernel_block_sizes`: MultipleOf(16)),
# the `kernel_block_alignment_size` of `_align_hybrid_block_size` for a CUDA host.
KERNEL_BLOCK_ALIGNMENT = 16


def _config_view(arch: Architecture, num_spec: int) -> types.SimpleNamespace:
    """What the model classes' state functions read from a VllmConfig, for `arch` at tensor-parallel size 1."""
    hf = types.SimpleNamespace(**arch.state_config)
    if "mamba_d_ssm" not in arch.state_config:
        hf.mamba_d_ssm = None
    spec = types.SimpleNamespace(num_speculative_tokens=num_spec) if num_spec else None
    return types.SimpleNamespace(
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1),
        cache_config=types.SimpleNamespace(mamba_cache_dtype="auto", mamba_ssm_cache_dtype="auto",
                                           use_replayssm=False, use_kda_recoverssm=False),
        model_config=types.SimpleNamespace(hf_config=hf, hf_text_config=hf, dtype=MODEL_DTYPE),
        speculative_config=spec, num_speculative_tokens=num_spec)


def _calculator_state(arch: Architecture, num_spec: int) -> tuple[tuple, tuple]:
    """The call `get_mamba_state_shape_from_config` makes, made directly (a class that does not import)."""
    c = arch.state_config
    if arch.mixer != "gdn":
        raise VllmUnsupported(f"{arch.vllm_class} does not import on this host and has no direct calculator here")
    shapes = api.MambaStateShapeCalculator.gated_delta_net_state_shape(
        1, c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
        c["linear_value_head_dim"], c["linear_conv_kernel_dim"], num_spec)
    dtypes = api.MambaStateDtypeCalculator.gated_delta_net_state_dtype(MODEL_DTYPE, "auto", "auto")
    return tuple(shapes), tuple(dtypes)


@lru_cache(maxsize=32)
def mamba_state(name: str, num_spec: int) -> tuple[tuple, tuple, str]:
    """(shapes, dtypes, source) of one mamba layer of `name`; `source` names the vLLM function used."""
    arch = registry.get(name)
    try:
        cls = getattr(api, arch.vllm_class)
    except VllmUnsupported:
        shapes, dtypes = _calculator_state(arch, num_spec)
        return shapes, dtypes, "MambaStateShapeCalculator (class not importable on this host)"
    view = _config_view(arch, num_spec)
    shapes = tuple(cls.get_mamba_state_shape_from_config(view))
    dtypes = tuple(cls.get_mamba_state_dtype_from_config(view))
    return shapes, dtypes, f"{arch.vllm_class}.get_mamba_state_shape_from_config"


def mamba_page_bytes(name: str, num_spec: int = 0) -> int:
    shapes, dtypes, _ = mamba_state(name, num_spec)
    return api.MambaSpec(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes


def attention_page_bytes_per_token(arch: Architecture) -> int:
    return api.FullAttentionSpec(block_size=1, num_kv_heads=arch.num_kv_heads, head_size=arch.head_dim,
                                 dtype=MODEL_DTYPE).page_size_bytes


def align_block_size(name: str, block_size: int = 16, num_spec: int = 0) -> int:
    """The block size vLLM 0.32 runs `name` with in align mode on a CUDA host (FlashAttention): platforms/
    interface.py `_align_hybrid_block_size`, `attn_block_size = alignment * cdiv(mamba_page, alignment *
    attn_page_1_token)`, the cache block raised to it, and `mamba_block_size = block_size` in align mode.
    Mirrored: the method needs a model config vLLM resolves and the attention backend class."""
    arch = registry.get(name)
    alignment = max(KERNEL_BLOCK_ALIGNMENT, block_size)
    need = alignment * -(-mamba_page_bytes(name, num_spec) // (alignment * attention_page_bytes_per_token(arch)))
    return max(block_size, need)


def layer_names(arch: Architecture, mtp_layers: int) -> list[tuple[str, str]]:
    """(layer name, kind) in the model's order, as vLLM prefixes them; a PARALLEL layer gives two."""
    out: list[tuple[str, str]] = []
    for i, kind in enumerate(arch.layout):
        if kind in (ATTENTION, SLIDING, PARALLEL):
            out.append((f"model.layers.{i}.self_attn.attn", SLIDING if kind == SLIDING else ATTENTION))
        if kind in (MAMBA, PARALLEL):
            out.append((f"model.layers.{i}.mixer", MAMBA))
    out += [(f"mtp.layers.{i}.self_attn.attn", ATTENTION) for i in range(mtp_layers)]
    return out


def layer_specs(name: str, attn_block: int, mamba_block: int, caching: bool, spec_blocks: int,
                checkpoint_blocks: int, checkpoint_alignment: int | None, mamba_kwargs_fit) -> dict:
    """Every KV-cache layer of `name` and its spec, pages padded to one size. `mamba_kwargs_fit` fits the
    MambaSpec keywords to the installed release (vllm_compat's features.fit_kwargs)."""
    arch = registry.get(name)
    shapes, dtypes, _ = mamba_state(name, spec_blocks)
    attn_kwargs = dict(block_size=attn_block, num_kv_heads=arch.num_kv_heads, head_size=arch.head_dim,
                       dtype=MODEL_DTYPE)
    attn = api.FullAttentionSpec(**attn_kwargs)
    sliding = api.SlidingWindowSpec(**attn_kwargs, sliding_window=arch.sliding_window) \
        if arch.sliding_window else None
    mamba_kwargs = dict(block_size=mamba_block, shapes=shapes, dtypes=dtypes, num_speculative_blocks=spec_blocks)
    if caching:
        mamba_kwargs.update(mamba_cache_mode="align", num_prefill_checkpoint_blocks=checkpoint_blocks,
                            prefill_checkpoint_alignment=checkpoint_alignment)
    mamba = api.MambaSpec(**mamba_kwargs_fit(mamba_kwargs))
    page = max(s.page_size_bytes for s in (attn, mamba, sliding) if s is not None)
    pad = {}
    for kind, spec in ((ATTENTION, attn), (MAMBA, mamba), (SLIDING, sliding)):
        if spec is not None:
            pad[kind] = spec if spec.page_size_bytes == page else dataclasses.replace(spec, page_size_padded=page)
    mtp = arch.mtp_layers if spec_blocks else 0
    return {layer: pad[kind] for layer, kind in layer_names(arch, mtp)}


def group_counts(groups) -> dict[str, int]:
    """{"attention": n, "mamba": n, ...} over vLLM's groups, by spec class."""
    counts: dict[str, int] = {}
    for g in groups:
        kind = "mamba" if isinstance(g.kv_cache_spec, api.MambaSpec) else \
            "sliding_window" if isinstance(g.kv_cache_spec, api.SlidingWindowSpec) else "attention"
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def describe(name: str, groups, num_spec: int = 0) -> str:
    """One line for the trace header: the model, its group counts and (a registered full-size model)
    the block size vLLM itself would run it with."""
    arch = registry.get(name)
    counts = group_counts(groups)
    parts = ", ".join(f"{n} {k}" for k, n in counts.items())
    line = f"{arch.title} ({name}): {len(groups)} KV-cache groups ({parts})"
    if arch.state_config:
        line += f"; vLLM's align-mode block size for it: {align_block_size(name, num_spec=num_spec)} tokens"
    return line
