"""vLLM's own V1 worker bookkeeping, called on CPU: what the worker really does for each row.

The kernel model (mambafuzz/sim/worker/kernel_model.py) is a hand-written mirror of vLLM's worker. This module is
the other side of a conformance check: it feeds one scheduled step to vLLM 0.32.0's *real* worker
functions and reports, per row, what they decided (`RowPlan`). Called, not mirrored:

- `InputBatch.add_request` / `remove_request` / `condense` (vllm/v1/worker/gpu_input_batch.py):
  the persistent batch, whose per-row `num_accepted_tokens_cpu` resets when a request re-enters;
- `reorder_batch_to_split_decodes_and_prefills` (vllm/v1/attention/backends/utils.py);
- `preprocess_mamba` (vllm/v1/worker/mamba_utils.py): `mamba_state_idx`, the accepted-token reset
  and the pre-forward copies (non-fused path without spec decode; the fused Triton pre-copy with it);
- `GDNAttentionMetadataBuilder.build` (vllm/v1/attention/backends/gdn_attn.py) and
  `Mamba2AttentionMetadataBuilder.build` (vllm/v1/attention/backends/mamba2_attn.py), which also
  call `compute_mamba_prefill_checkpoints` (vllm/model_executor/layers/mamba/checkpoint.py);
- `stage_postprocess_inputs_to_gpu` + `postprocess_mamba_align_gpu` (mamba_utils.py): the fused
  post-forward copy and accepted-token update of a spec-decode engine.

Reconstructed (kept minimal, each names the vLLM code it stands for):
- `_sync_batch` stands for `GPUModelRunner._update_states` (gpu_model_runner.py:1172-1496): drop
  finished and unscheduled requests from the batch, (re-)add new, resumed and previously unscheduled
  ones, set num_computed_tokens and block tables;
- `_common_metadata` stands for `GPUModelRunner._build_attention_metadata`'s
  `CommonAttentionMetadata` (gpu_model_runner.py:2316-2412) and the spec-decode inputs of
  `_prepare_inputs` (`num_decode_draft_tokens`, gpu_model_runner.py:2197-2231);
- `_interpret_*` read each mixer's kernel contract off the builder's metadata (which state index a
  kernel reads and writes), because the forward kernels themselves do not run on CPU; the mixer
  lines are cited there.

Copies are observed, not derived: every block of a one-element int64 "temporal" state tensor holds
its own id before a copy phase, so after it `state[dst] == src` names each copy the kernels made.
Only the temporal (SSM) state is registered: conv-state copies use the same columns and bias.
Triton kernels run in Triton's interpreter (mambafuzz/sim/bridge/vllm_compat/triton_cpu.py).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from types import SimpleNamespace

from mambafuzz.sim.bridge.vllm_compat import triton_cpu

triton_cpu.require()  # the process's start-up step enabled it (mambafuzz.search.startup)

import torch  # noqa: E402

from mambafuzz.conform.rows import DECODE, PREFILL, SPEC_DECODE, RowInput, RowPlan, StepInput, Write  # noqa: E402
from mambafuzz.sim.bridge.vllm_compat.api import (  # noqa: E402
    CachedRequestState,
    CommonAttentionMetadata,
    CpuGpuBuffer,
    GDNAttentionMetadataBuilder,
    KVCacheConfig,
    KVCacheGroupSpec,
    Mamba2AttentionMetadataBuilder,
    MambaAttentionBackendEnum,
    MambaSpec,
    VllmConfig,
    get_temporal_copy_spec,
    reorder_batch_to_split_decodes_and_prefills,
)
from mambafuzz.sim.bridge.vllm_compat.api import (  # noqa: E402
    worker_mamba_utils as mamba_utils,
)
from mambafuzz.sim.worker.v1_input_batch import cached_request, greedy_sampling, new_input_batch  # noqa: E402

VLLM_VERSION = "0.32.0"
LAYER = "conform.mamba"  # the one mamba layer of the worker's single mamba group
CPU = torch.device("cpu")


def _cpu_buffer(*size: int, dtype: torch.dtype) -> CpuGpuBuffer:
    return CpuGpuBuffer(*size, dtype=dtype, device=CPU, pin_memory=False)


class V1Worker:
    """One V1 model runner's mamba bookkeeping, persistent across steps like the real one."""

    runner = "v1"

    def __init__(self, vllm_config: VllmConfig, mamba_spec: MambaSpec, num_blocks: int, hash_block_size: int,
                 cache_hit_alignment_tokens: int, max_model_len: int, max_num_reqs: int = 16,
                 temporal_tiles: int | None = 1):
        """`vllm_config` is the scheduler's (only read); `mamba_spec` the scheduler's mamba group
        spec (block size, speculative and checkpoint blocks); `hash_block_size` and
        `cache_hit_alignment_tokens` what the engine core resolved for the scheduler; `max_model_len`
        the scheduler's (it sizes the persistent batch's token buffer).

        `temporal_tiles` replaces mamba_utils._TEMPORAL_TILES (16) while the fused copy kernels
        run: it only splits one copy's bytes across programs ("TEMPORAL_TILES == 1 ... reproduces
        the untiled behavior", mamba_utils.py `_copy_mamba_state_block`), and each interpreted
        program costs milliseconds. None keeps vLLM's value."""
        self.temporal_tiles = temporal_tiles
        self.vllm_config = vllm_config
        self.spec = MambaSpec(
            block_size=mamba_spec.block_size, shapes=((1,),), dtypes=(torch.int64,),
            mamba_type=MambaAttentionBackendEnum.LINEAR, mamba_cache_mode="align",
            num_speculative_blocks=mamba_spec.num_speculative_blocks,
            num_prefill_checkpoint_blocks=mamba_spec.num_prefill_checkpoint_blocks,
            prefill_checkpoint_alignment=mamba_spec.prefill_checkpoint_alignment,
        )
        self.kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                             kv_cache_groups=[KVCacheGroupSpec([LAYER], self.spec)])
        self.copy_funcs = {self.spec.mamba_type: (get_temporal_copy_spec,)}
        self.state = torch.arange(num_blocks, dtype=torch.int64).reshape(num_blocks, 1)
        self.forward_context = {LAYER: SimpleNamespace(kv_cache=[self.state])}
        self.num_spec = vllm_config.num_speculative_tokens
        self.max_blocks = -(-max_model_len // self.spec.block_size) + self.num_spec + 2
        self.input_batch = new_input_batch(
            max_num_reqs=max_num_reqs, max_model_len=max_model_len,
            max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
            vocab_size=vllm_config.model_config.get_vocab_size(), block_size=self.spec.block_size,
            max_blocks=self.max_blocks, num_spec_tokens=self.num_spec,
        )
        self.requests: dict[str, CachedRequestState] = {}
        # Per row of the step: the first column its copies can land in (`_observe_copies`).
        self.live_from: dict[str, int] = {}
        self.mamba_state_idx: dict[str, int] = {}
        # MambaBuffers.create as GPUModelRunner._get_mamba_bufs builds them (gpu_model_runner.py:1015)
        self.bufs = mamba_utils.MambaBuffers.create(
            max_num_reqs=max_num_reqs, kv_cache_config=self.kv_cache_config, copy_funcs=self.copy_funcs,
            make_buffer=_cpu_buffer, device=CPU, with_postprocess_align=self.num_spec > 0,
        )
        self.worker_config = self._worker_config(hash_block_size, cache_hit_alignment_tokens)
        self.builders = {
            "gdn": GDNAttentionMetadataBuilder(self.spec, [LAYER], self.worker_config, CPU),
            "mamba2": Mamba2AttentionMetadataBuilder(self.spec, [LAYER], self.worker_config, CPU),
        }
        # GPUModelRunner.calculate_reorder_batch_threshold: the min over builders (full attention's is None)
        self.reorder_threshold = min(b.reorder_batch_threshold for b in self.builders.values())
        self._sampling = greedy_sampling()
        # Async scheduling (read from the scheduler's config): the accepted counts of the previous
        # step reach the CPU by an asynchronous copy to the rows they were computed in (`_landing`),
        # and `_prepare_inputs` gathers them through the batch's own `prev_req_id_to_index`, which
        # vLLM's `InputBatch.remove_request` prunes (a request dropped from the batch starts again at 1).
        self.async_scheduling = bool(getattr(vllm_config.scheduler_config, "async_scheduling", False))
        self._landing: dict[int, int] = {}

    def _worker_config(self, hash_block_size: int, cache_hit_alignment_tokens: int) -> VllmConfig:
        """The worker's view of the config: its cache config carries the two fields the engine core
        resolves from the scheduler's KV-cache groups (engine/core.py:361-375, gpu_worker.py:864)."""
        wc = copy.copy(self.vllm_config)
        wc.cache_config = copy.copy(self.vllm_config.cache_config)
        wc.cache_config.hash_block_size = hash_block_size
        wc.cache_config.cache_hit_alignment_tokens = cache_hit_alignment_tokens
        return wc

    # ---- one step ------------------------------------------------------------------
    def step(self, step: StepInput) -> list[RowPlan]:
        """Run one step's worker bookkeeping through vLLM and return a RowPlan per row and mixer.
        A step without rows only updates the batch, as execute_model returns right after
        _update_states when nothing is scheduled."""
        out = self._scheduler_output(step)
        self.note_live_columns(step)
        self._sync_batch(step, out)
        if not step.rows:
            self._land_accepted()  # the previous forward's counts land while this step's host code runs
            return []
        ib = self.input_batch
        num_reqs = ib.num_reqs
        if self.async_scheduling and self.num_spec > 0:
            self.gather_async_accepted(num_reqs)
        ib.block_table.commit_block_table(num_reqs)
        pre = self._observe_copies(lambda: mamba_utils.preprocess_mamba(
            out, self.kv_cache_config, self.worker_config.cache_config, self.mamba_state_idx, ib,
            self.requests, self.forward_context, self.copy_funcs, self.bufs.preprocess,
            align_ctx=self.bufs.postprocess_align))
        # gpu_model_runner.py:4107: the kernels read the accepted counts preprocess_mamba left
        num_accepted = torch.from_numpy(ib.num_accepted_tokens_cpu[:num_reqs].copy()).to(torch.int32)
        rows = {r.req_id: r for r in step.rows}
        order = list(ib.req_ids)
        cm, draft_counts = self._common_metadata([rows[r] for r in order])
        kwargs = {}
        if self.num_spec > 0:
            kwargs = dict(num_accepted_tokens=num_accepted, num_decode_draft_tokens_cpu=draft_counts)
        metadata = {name: b.build(0, cm, **kwargs) for name, b in self.builders.items()}
        post = self._postprocess(out, [rows[r] for r in order]) if self.num_spec > 0 else {}
        if self.async_scheduling and self.num_spec > 0:
            self._landing = {i: int(ib.num_accepted_tokens_cpu[i]) for i in range(num_reqs)}
            # gpu_model_runner.py:3549: the rows that sampled (a chunk short of the prompt end is discarded)
            ib.prev_req_id_to_index = {rid: i for i, rid in enumerate(ib.req_ids[:num_reqs]) if rows[rid].samples}
        plans = []
        for name, md in metadata.items():
            interpret = _interpret_gdn if name == "gdn" else _interpret_mamba2
            for i, (rid, kind, has_init, read_col, acc, writes, ckpt) in enumerate(
                    interpret(md, [rows[r] for r in order], self.spec.block_size)):
                table = rows[rid].block_ids
                plans.append(RowPlan(
                    runner=self.runner, mixer=name, req_id=rid, batch_row=i, kind=kind,
                    has_initial_state=has_init, read_column=read_col,
                    read_block=None if read_col is None else _block(table, read_col),
                    num_accepted=acc, writes=writes, checkpoint_offset=ckpt,
                    pre_copies=pre.get(rid, ()), post_copies=post.get(rid, ()),
                ))
        return plans

    # ---- reconstructed runner glue -------------------------------------------------------
    def _scheduler_output(self, step: StepInput) -> SimpleNamespace:
        """The SchedulerOutput fields preprocess_mamba and stage_postprocess_inputs_to_gpu read."""
        return SimpleNamespace(
            finished_req_ids=set(step.finished), preempted_req_ids=set(step.preempted),
            scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set(step.resumed)),
            num_scheduled_tokens={r.req_id: r.num_scheduled for r in step.rows},
            scheduled_spec_decode_tokens={r.req_id: [-1] * r.num_drafts for r in step.rows if r.num_drafts},
        )

    def _sync_batch(self, step: StepInput, out: SimpleNamespace) -> None:
        """GPUModelRunner._update_states, reduced to what the mamba path reads."""
        ib = self.input_batch
        for rid in step.finished:
            self.requests.pop(rid, None)
            ib.remove_request(rid)
        scheduled = {r.req_id for r in step.rows}
        for rid in set(ib.req_id_to_index) - (scheduled - set(step.resumed)):
            ib.remove_request(rid)
        to_add = []
        for r in step.rows:
            state = self.requests.get(r.req_id)
            if state is None or r.req_id in step.resumed:
                state = cached_request(r.req_id, r.num_prompt_tokens, r.block_ids, r.num_computed, self._sampling)
                self.requests[r.req_id] = state
            state.num_computed_tokens = r.num_computed
            state.block_ids = (list(r.block_ids),)
            if r.req_id in ib.req_id_to_index:
                idx = ib.req_id_to_index[r.req_id]
                ib.num_computed_tokens_cpu[idx] = r.num_computed
                ib.block_table.add_row(state.block_ids, idx)
            else:
                to_add.append(state)
        for state in to_add:
            ib.add_request(state)
        ib.condense()
        reorder_batch_to_split_decodes_and_prefills(ib, out, decode_threshold=self.reorder_threshold)
        ib.refresh_metadata()

    def gather_async_accepted(self, num_reqs: int) -> None:
        """`GPUModelRunner._prepare_inputs` under async scheduling in align mode (gpu_model_runner.py:
        2063-2090): with a non-empty `prev_req_id_to_index` each row takes the accepted count at its
        request's row of the previous step, a row new to the mapping 1; with an empty one (every row
        that sampled last step has left the batch) the counts are read where they lie. The previous
        step's counts land at their old rows after this step's condense() (the device-to-host copy
        still runs while the next step's `_update_states` moves rows): the usual order on a GPU,
        emulated by writing them back over what condense() moved. In the empty-mapping branch a
        moved row then reads another request's count (vllm-project/vllm#51571's family). The other
        order, a copy that lands first, is a timing race this tier does not model."""
        ib = self.input_batch
        self._land_accepted()
        prev = ib.prev_req_id_to_index
        if not prev:  # gpu_model_runner.py:2074: an empty mapping takes the synchronous branch (counts as they lie)
            return
        gathered = [int(ib.num_accepted_tokens_cpu[p]) if (p := prev.get(rid)) is not None else 1
                    for rid in ib.req_ids[:num_reqs]]
        ib.num_accepted_tokens_cpu[:num_reqs] = gathered

    def _land_accepted(self) -> None:
        """The previous forward's accepted counts reach `num_accepted_tokens_cpu`, at the rows
        they were computed in, after the next step's condense(), whether that step runs rows or
        not (a step without rows still runs `_update_states`); once."""
        for index, count in self._landing.items():
            self.input_batch.num_accepted_tokens_cpu[index] = count
        self._landing = {}

    def _common_metadata(self, rows: Sequence[RowInput]) -> tuple[CommonAttentionMetadata, torch.Tensor]:
        """CommonAttentionMetadata as _build_attention_metadata fills it (synchronous scheduling,
        no padding), and _prepare_inputs' num_decode_draft_tokens (-1: not a decode row)."""
        ib = self.input_batch
        n = len(rows)
        q = torch.tensor([r.num_scheduled for r in rows], dtype=torch.int32)
        qsl = torch.zeros(n + 1, dtype=torch.int32)
        qsl[1:] = torch.cumsum(q, 0)
        seq_lens = torch.tensor([r.num_computed + r.num_scheduled for r in rows], dtype=torch.int32)
        is_prefilling = ib.num_computed_tokens_cpu_tensor[:n] < ib.num_prompt_tokens_cpu_tensor[:n]
        drafts = torch.full((n,), -1, dtype=torch.int32)
        for i, r in enumerate(rows):
            if r.num_drafts and r.num_scheduled == r.num_drafts + 1:
                drafts[i] = r.num_drafts
            elif drafts[i] < 0 and r.num_computed >= r.num_prompt_tokens and r.num_scheduled == 1:
                drafts[i] = 0  # zero_draft_decode_mask
        cm = CommonAttentionMetadata(
            query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens,
            seq_lens_cpu_upper_bound=seq_lens.clone(), num_reqs=n, num_actual_tokens=int(qsl[-1]),
            max_query_len=int(q.max()), max_seq_len=int(seq_lens.max()),
            block_table_tensor=ib.block_table[0].get_device_tensor(n),
            slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64), causal=True,
            is_prefilling=is_prefilling.clone(),
        )
        return cm, drafts

    def _postprocess(self, out: SimpleNamespace, rows: Sequence[RowInput]) -> dict[str, tuple[tuple[int, int], ...]]:
        """_update_states_after_model_execute in align mode (gpu_model_runner.py:1544-1583): the
        sampled-token count per row becomes num_accepted, then the fused postprocess kernel."""
        ib = self.input_batch
        n = len(rows)
        ctx = self.bufs.postprocess_align
        mamba_utils.stage_postprocess_inputs_to_gpu(ctx, out, ib.req_ids, n, self.requests, self.mamba_state_idx)
        accepted = torch.tensor([max(r.num_sampled, 1) for r in rows], dtype=torch.int32)
        return self._observe_copies(lambda: mamba_utils.postprocess_mamba_align_gpu(
            bufs=self.bufs, num_reqs=n, num_accepted_tokens_gpu=accepted,
            num_accepted_tokens_cpu_tensor=ib.num_accepted_tokens_cpu_tensor, input_batch=ib,
            kv_cache_config=self.kv_cache_config, forward_context=self.forward_context,
            mamba_state_copy_funcs=self.copy_funcs))

    def note_live_columns(self, step: StepInput) -> None:
        """Where each row's copies can land: at or after the column of its last computed token
        (a pre-copy goes to the running column, a post-copy to the aligned one, neither behind the
        state the row starts from). Columns before it hold blocks the worker's table still lists
        but vLLM's manager may have freed and handed to another request (it nulls them without a
        message: mambafuzz/sim/worker/worker_tables.py), so they must not claim that request's copies."""
        bs = self.spec.block_size
        self.live_from = {r.req_id: max(0, (r.num_computed - 1) // bs) for r in step.rows}

    def _observe_copies(self, phase, rows: list[str] | None = None) -> dict[str, tuple[tuple[int, int], ...]]:
        """Run `phase` with every block holding its own id; return the copies it made, by request
        (the request among this step's `rows`, default the batch's, whose table holds the
        destination block in its live columns: `note_live_columns`)."""
        self.state.copy_(torch.arange(self.state.shape[0], dtype=torch.int64).reshape(-1, 1))
        saved = mamba_utils._TEMPORAL_TILES
        if self.temporal_tiles is not None:
            mamba_utils._TEMPORAL_TILES = self.temporal_tiles
        try:
            with triton_cpu.interpreting():
                phase()
        finally:
            mamba_utils._TEMPORAL_TILES = saved
        moved = (self.state[:, 0] != torch.arange(self.state.shape[0])).nonzero().flatten().tolist()
        # Only this step's rows own blocks: a request left out of the batch (preempted, or just
        # not scheduled) keeps its state in `requests`, but its freed blocks may now be a row's.
        rows = [rid for rid in self.input_batch.req_ids if rid is not None] if rows is None else rows
        owner = {b: rid for rid in rows for b in self.requests[rid].block_ids[0][self.live_from.get(rid, 0):] if b > 0}
        copies: dict[str, list[tuple[int, int]]] = {}
        for dst in moved:
            copies.setdefault(owner.get(dst, "?"), []).append((int(self.state[dst, 0]), dst))
        return {rid: tuple(c) for rid, c in copies.items()}


def _block(table: Sequence[int], column: int) -> int:
    return table[column] if 0 <= column < len(table) else -1


def _column(table: Sequence[int], block: int, seq_len: int, block_size: int) -> int:
    """The block-table column a state index came from: the gathered window starts at
    (seq_len - 1) // block_size (mamba_get_block_table_tensor, attention/backends/utils.py:1185)."""
    start = max((seq_len - 1) // block_size, 0)
    for col in range(start, len(table)):
        if table[col] == block:
            return col
    return table.index(block) if block in table else -1


_Row = tuple[str, str, bool, "int | None", int, tuple[Write, ...], int]


def _spec_row(r: RowInput, idx: list[int], acc: int, bs: int) -> _Row:
    """A speculative row (GDN fused_sigmoid_gating_delta_rule_update via qwen_gdn_linear_attn.py:1557;
    Mamba2 selective_state_update via mamba_mixer2.py:1090-1093): reads idx[acc - 1], writes the
    state after token t into idx[t]."""
    seq_len = r.num_computed + r.num_scheduled
    cols = [_column(r.block_ids, b, seq_len, bs) for b in idx]
    writes = tuple(Write(cols[t], idx[t], "spec-token") for t in range(min(r.num_scheduled, len(idx))))
    return (r.req_id, SPEC_DECODE, True, cols[acc - 1], acc, writes, 0)


def _plain_row(r: RowInput, kind: str, block: int, has_init: bool, bs: int,
               ckpt: tuple[int, int, int] | None) -> _Row:
    """A prefill or plain decode row: reads `block` (zeros without an initial state) and writes
    the final state back into it (qwen_gdn_linear_attn.py:1599-1619; mamba_mixer2.py:840-897)."""
    seq_len = r.num_computed + r.num_scheduled
    col = _column(r.block_ids, block, seq_len, bs)
    writes = [Write(col, block, "final")]
    offset = 0
    if ckpt is not None:
        offset, ckpt_col, ckpt_block = ckpt
        writes.append(Write(ckpt_col, ckpt_block, "checkpoint"))
    return (r.req_id, kind, has_init, col if has_init else None, 1, tuple(writes), offset)


def _checkpoints(meta) -> dict[int, tuple[int, int, int]]:
    """Batch row -> (offset, column, block) of the internal prefill checkpoint the builder planned
    (MambaPrefillCheckpointMetadata from compute_mamba_prefill_checkpoints)."""
    if meta is None:
        return {}
    rows = meta.request_rows.tolist()
    return {rows[i]: (int(meta.checkpoint_offsets[i]), int(meta.block_cols[i]), int(meta.state_indices[i]))
            for i in range(len(rows)) if int(meta.checkpoint_offsets[i]) > 0}


def _interpret_gdn(md, rows: Sequence[RowInput], bs: int) -> list[_Row]:
    """GDNAttentionMetadata -> per-row reads/writes. Qwen's GDN mixer never consumes
    `md.checkpoint` (no use in layers/mamba/gdn/), so a GDN row writes no checkpoint."""
    spec_mask = md.spec_sequence_masks_cpu.tolist() if md.spec_sequence_masks_cpu is not None else [False] * len(rows)
    out: list[_Row] = []
    s = k = 0
    for i, r in enumerate(rows):
        if spec_mask[i]:
            idx = md.spec_state_indices_tensor[s].tolist()
            out.append(_spec_row(r, idx, int(md.num_accepted_tokens[s]), bs))
            s += 1
            continue
        block = int(md.non_spec_state_indices_tensor[k])
        is_decode = k < md.num_decodes
        has_init = True if is_decode else bool(md.has_initial_state[k])
        out.append(_plain_row(r, DECODE if is_decode else PREFILL, block, has_init, bs, None))
        k += 1
    return out


def _interpret_mamba2(md, rows: Sequence[RowInput], bs: int) -> list[_Row]:
    """Mamba2AttentionMetadata -> per-row reads/writes: the first num_decodes rows decode (spec
    rows when num_accepted_tokens is set), the rest prefill; checkpoints from checkpoint_meta."""
    ckpts = _checkpoints(md.checkpoint_meta)
    out: list[_Row] = []
    for i, r in enumerate(rows):
        if i < md.num_decodes:
            idx = md.state_indices_tensor_d[i].tolist()
            if md.num_accepted_tokens is not None:
                out.append(_spec_row(r, idx, int(md.num_accepted_tokens[i]), bs))
            else:
                out.append(_plain_row(r, DECODE, idx[0], True, bs, None))
            continue
        p = i - md.num_decodes
        block = int(md.state_indices_tensor_p[p])
        out.append(_plain_row(r, PREFILL, block, bool(md.has_initial_states_p[p]), bs, ckpts.get(i)))
    return out


