"""Conformance of the mixer mirror (fuzz/mixers.py) with vLLM's own metadata builders.

vLLM's `GDNAttentionMetadataBuilder.build` and `Mamba2AttentionMetadataBuilder.build` run on a
CPU `CommonAttentionMetadata`. This module hands them one row at a time, with the runner facts
the mirror derives (fuzz/runners.py: `is_prefilling`, `num_decode_draft_tokens`, the accepted
count), and reads back what the kernels would do: which path the row takes, which column of the
request's block table it starts from, and whether a prefill row keeps its initial state.

One row per batch on purpose: the builders' prefill/decode split assumes the runner's reorder
put decodes first, which the mirror does not model (see corpus/upstream/RUNNERS.md). The runner
facts themselves come from GPU-only code (the runners' input preparation) and are the mirror's.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any, NamedTuple

import torch

from fuzz import vllm_bridge as vb
from fuzz.kernel_model import cdiv
from fuzz.mixers import PREFILL, SPEC, mixer_rules
from fuzz.runners import BuilderInputs, RowFacts, runner_rules
from fuzz.scenario import EngineConfig

COLUMN_BASE = 1000  # block id of column c in the synthetic block table: COLUMN_BASE + c


class RowOutcome(NamedTuple):
    """What one row does, as the kernels would see it."""

    path: str  # mixers.SPEC or mixers.PREFILL
    read_column: int  # the column of the request's block table the kernel starts from
    has_initial_state: bool  # False: the kernel starts from zeros


@lru_cache(maxsize=8)
def _builder(mixer: str, block_size: int, num_speculative_tokens: int) -> Any:
    """vLLM's metadata builder for `mixer`, on CPU, for an MTP engine with k speculative tokens
    (or none) and an align-mode mamba group of `block_size`."""
    from fuzz.vllm_compat.api import MambaSpec, set_current_vllm_config

    spec_kw = dict(spec_method="mtp", num_speculative_tokens=num_speculative_tokens) if num_speculative_tokens else {}
    vc = vb.vllm_config_for(EngineConfig(mamba_block_size=block_size, attn_block_size=block_size, **spec_kw), 4096)
    shapes = ((4, 4), (2, 4, 4))  # conv state, ssm state (heads, head dim, state dim): any small shapes build
    spec = MambaSpec(block_size=block_size, shapes=shapes, dtypes=(torch.float32, torch.float32),
                     mamba_cache_mode="align", num_speculative_blocks=num_speculative_tokens)
    with set_current_vllm_config(vc):
        from fuzz.vllm_compat import api

        Builder = api.GDNAttentionMetadataBuilder if mixer == "gdn" else api.Mamba2AttentionMetadataBuilder
        return vc, Builder(spec, ["conform"], vc, torch.device("cpu"))


def vllm_outcome(mixer: str, block_size: int, num_speculative_tokens: int, row: RowFacts,
                 inputs: BuilderInputs, num_accepted: int) -> RowOutcome:
    """Run vLLM's builder for `mixer` on this one row and read its classification back."""
    from fuzz.vllm_compat.api import CommonAttentionMetadata, set_current_vllm_config

    vc, builder = _builder(mixer, block_size, num_speculative_tokens)
    n, seq_len = row.num_scheduled, row.num_computed + row.num_scheduled
    qsl = torch.tensor([0, n], dtype=torch.int32)
    seq = torch.tensor([seq_len], dtype=torch.int32)
    columns = cdiv(seq_len, block_size) + num_speculative_tokens
    table = torch.arange(COLUMN_BASE, COLUMN_BASE + columns, dtype=torch.int32).unsqueeze(0)
    meta = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq, num_reqs=1, num_actual_tokens=n,
        max_query_len=n, max_seq_len=seq_len, block_table_tensor=table,
        slot_mapping=torch.zeros(n, dtype=torch.int64), is_prefilling=torch.tensor([inputs.is_prefilling]),
        seq_lens_cpu_upper_bound=seq)
    extra: dict[str, Any] = {}
    if num_speculative_tokens:
        extra = dict(num_accepted_tokens=torch.tensor([num_accepted], dtype=torch.int32),
                     num_decode_draft_tokens_cpu=torch.tensor([inputs.decode_drafts], dtype=torch.int32))
    with set_current_vllm_config(vc):
        md = builder.build(0, meta, **extra)
    return _read_back(mixer, md, num_accepted)


def _read_back(mixer: str, md: Any, num_accepted: int) -> RowOutcome:
    if mixer == "gdn":
        if md.num_spec_decodes:  # fused_sigmoid_gating: ssm_state_indices[i, num_accepted - 1]
            return RowOutcome(SPEC, int(md.spec_state_indices_tensor[0, num_accepted - 1]) - COLUMN_BASE, True)
        initial = True if md.num_prefills == 0 else bool(md.has_initial_state[0])  # a decode reads unmasked
        return RowOutcome(PREFILL, int(md.non_spec_state_indices_tensor[0]) - COLUMN_BASE, initial)
    if md.num_decodes:  # selective_state_update: state_batch_indices[i, num_accepted - 1] when spec
        spec = md.num_accepted_tokens is not None
        col = int(md.state_indices_tensor_d[0, num_accepted - 1 if spec else 0]) - COLUMN_BASE
        return RowOutcome(SPEC if spec else PREFILL, col, True)
    return RowOutcome(PREFILL, int(md.state_indices_tensor_p[0]) - COLUMN_BASE, bool(md.has_initial_states_p[0]))


def mirror_outcome(runner: str, mixer: str, block_size: int, num_speculative_tokens: int, row: RowFacts,
                   num_accepted: int) -> tuple[BuilderInputs, RowOutcome]:
    """What fuzz/runners.py and fuzz/mixers.py say about the same row (the kernel model's
    running column `cdiv(seq_len, block) - 1` is the first gathered column)."""
    spec_engine = num_speculative_tokens > 0
    inputs = runner_rules(runner).builder_inputs(row, spec_engine, num_speculative_tokens)
    path = mixer_rules(mixer).path(inputs, row.num_computed, row.num_scheduled, spec_engine, num_speculative_tokens)
    curr = cdiv(row.num_computed + row.num_scheduled, block_size) - 1
    if path == SPEC:
        return inputs, RowOutcome(SPEC, curr + num_accepted - 1, True)
    return inputs, RowOutcome(PREFILL, curr, row.num_computed > 0)


@dataclasses.dataclass
class Mismatch:
    runner: str
    mixer: str
    row: RowFacts
    num_accepted: int
    mirror: RowOutcome
    vllm: RowOutcome


def check(rows: list[tuple[RowFacts, int]], block_size: int = 16, num_speculative_tokens: int = 1) -> list[Mismatch]:
    """Every (runner, mixer, row) where the mirror and vLLM's builder disagree."""
    out = []
    for runner in ("v1", "v2"):
        for mixer in ("gdn", "mamba2"):
            for row, accepted in rows:
                inputs, mine = mirror_outcome(runner, mixer, block_size, num_speculative_tokens, row, accepted)
                theirs = vllm_outcome(mixer, block_size, num_speculative_tokens, row, inputs, accepted)
                if mine != theirs:
                    out.append(Mismatch(runner, mixer, row, accepted, mine, theirs))
    return out
