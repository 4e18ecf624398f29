"""vLLM's own Model Runner V2 mamba bookkeeping, called on CPU (the V2 twin of conform_vllm.V1Worker).

V2 (the default runner on CUDA in vLLM 0.32.0) keeps each request's mamba state index and accepted
count in a per-request slot that survives unscheduled steps, and does the align pre-copy and the
post-forward copy in Triton kernels. Called, not mirrored (vllm/v1/worker/gpu/model_states/
mamba_hybrid.py, `MambaHybridModelState`):

- `add_request` (state index seeded from num_computed_tokens, accepted count reset to 1);
- `initialize_kv_cache` (the fused copy context over the slot-ordered and batch-ordered tables);
- `preprocess_state`: `preprocess_mamba_align_fused_kernel` + `run_fused_precopy`;
- `prepare_attn`: its own is_prefilling / num_decode_draft_tokens / num_accepted gather, then
  `build_attn_metadata` (vllm/v1/worker/gpu/attn_utils.py) into the GDN and Mamba2 builders;
- `postprocess_state`: `_scatter_num_accepted_kernel` + `run_fused_postprocess_align`;
- `sort_batch_req_ids` (vllm/v1/worker/gpu/model_runner.py) for the batch order.

The state object is made with `__new__` and given only the attributes those methods read (its
__init__ wants a loaded model). Reconstructed, each citing what it stands for:
- the request slots and block tables (`RequestState`, `BlockTables`; model_runner.py
  `finish_requests` / `add_requests` / `update_requests`, 1152-1256);
- the batch fields prepare_attn reads (`InputBatch`, gpu/input_batch.py), with
  is_prefilling_np and prefill_runs_as_decode_np as model_runner.py:1300-1331 computes them;
- post_update's advanced num_computed_tokens (before + scheduled - rejected drafts).
Not reachable on CPU: `compute_aligned_state_indices` asserts CUDA tensors, so the GDN builder
gathers its state indices with `mamba_get_block_table_tensor` (the same window, seq_len-1 based)
instead of V2's precomputed `mamba_aligned_state_indices`.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

from mambafuzz.sim.bridge.vllm_compat import triton_cpu

triton_cpu.require()  # enabled by the process's start-up step, before any vLLM kernel module is imported

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mambafuzz.conform import v1 as v1  # noqa: E402
from mambafuzz.conform.rows import RowInput, RowPlan, StepInput  # noqa: E402
from mambafuzz.sim.bridge.vllm_compat.api import (  # noqa: E402
    CUDAGraphMode,
    MambaHybridModelState,
    MambaSpec,
    VllmConfig,
    sort_batch_req_ids,
)

CPU = v1.CPU
GDN_LAYER, MAMBA2_LAYER = "conform.gdn", "conform.mamba2"


class _Group:
    """The slice of `AttentionGroup` (vllm/v1/worker/utils.py) build_attn_metadata uses."""

    def __init__(self, builder, spec: MambaSpec, layer: str):
        self.builder, self.kv_cache_spec, self.layer_names = builder, spec, [layer]

    def get_metadata_builder(self, ubatch_idx: int = 0):
        return self.builder

    def build_metadata(self, common_attn_metadata, ubatch_idx: int = 0, common_prefix_len: int = 0, **kwargs):
        return self.builder.build(common_prefix_len, common_attn_metadata, **kwargs)


class V2Worker:
    runner = "v2"

    def __init__(self, vllm_config: VllmConfig, mamba_spec: MambaSpec, num_blocks: int, hash_block_size: int,
                 cache_hit_alignment_tokens: int, max_model_len: int, max_num_reqs: int = 16,
                 temporal_tiles: int | None = 1):
        """Same arguments as conform_vllm.V1Worker; the builders and state tensor are built alike."""
        base = v1.V1Worker(vllm_config, mamba_spec, num_blocks, hash_block_size, cache_hit_alignment_tokens,
                           max_model_len, max_num_reqs, temporal_tiles)
        self.base = base  # for its spec, kv-cache config, state tensor, builders and copy observation
        self.spec, self.kv_cache_config = base.spec, base.kv_cache_config
        self.num_spec = base.num_spec
        self.max_num_reqs = max_num_reqs
        # vLLM's rows are base.max_blocks wide; a state column seeded past them (in the wrong units:
        # cache_config.block_size below the mamba block) reads out of bounds on a GPU and garbage
        # under Triton's interpreter. The tables here are wide enough for any such seed, and their
        # spare columns hold the null block: the copy reads block 0, the same on every run.
        finest = min(vllm_config.cache_config.block_size, self.spec.block_size)
        width = max(base.max_blocks, -(-max_model_len // finest) + self.num_spec + 2)
        self.slot_table = torch.zeros((max_num_reqs, width), dtype=torch.int32)
        self.batch_table = torch.zeros((max_num_reqs, width), dtype=torch.int32)
        self.slots: dict[str, int] = {}
        self.prefill_len = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed = torch.zeros(max_num_reqs, dtype=torch.int32)  # req_states.num_computed_tokens
        wc = base.worker_config
        wc.cache_config.mamba_block_size = self.spec.block_size
        wc.compilation_config = copy.copy(wc.compilation_config)  # initialize_kv_cache reads the layers here
        wc.compilation_config.static_forward_context = base.forward_context
        ms = MambaHybridModelState.__new__(MambaHybridModelState)
        ms.__dict__.update(
            vllm_config=wc, cache_config=wc.cache_config, max_num_reqs=max_num_reqs, device=CPU,
            max_model_len=max_model_len, rope_state=None, prompt_embeds_state=None, recoverssm=None,
            num_accepted_tokens_gpu=torch.ones(max_num_reqs, dtype=torch.int32), _align_mode=True,
            _mamba_state_idx_gpu=torch.zeros(max_num_reqs, dtype=torch.int32),
            _mamba_src_col_gpu=torch.full((max_num_reqs,), -1, dtype=torch.int32),
            _mamba_src_off_gpu=torch.zeros(max_num_reqs, dtype=torch.int32),
            _mamba_ctx=None, _mamba_group_ids=[], _mamba_spec=None, _mamba_state_copy_funcs=base.copy_funcs,
        )
        ms.initialize_kv_cache(self.kv_cache_config, SimpleNamespace(
            block_tables=[SimpleNamespace(gpu=self.slot_table)], input_block_tables=[self.batch_table]))
        self.ms = ms
        self.attn_groups = [[_Group(base.builders["gdn"], self.spec, GDN_LAYER),
                             _Group(base.builders["mamba2"], self.spec, MAMBA2_LAYER)]]

    def step(self, step: StepInput) -> list[RowPlan]:
        """One step through V2's mamba bookkeeping; a step without rows only frees and adds slots."""
        self._sync_slots(step)
        self.base.note_live_columns(step)
        if not step.rows:
            return []
        rows = {r.req_id: r for r in step.rows}
        drafts = {r.req_id: [-1] * r.num_drafts for r in step.rows if r.num_drafts}
        order = sort_batch_req_ids({r.req_id: r.num_scheduled for r in step.rows}, drafts, 1 + self.num_spec)
        batch = self._input_batch([rows[r] for r in order])
        pre = self.base._observe_copies(lambda: self.ms.preprocess_state(
            batch, (self.batch_table,), self.kv_cache_config, self.num_computed), order)
        metadata = self.ms.prepare_attn(batch, CUDAGraphMode.NONE, (self.batch_table[:batch.num_reqs],),
                                        [torch.zeros(batch.num_tokens, dtype=torch.int64)], self.attn_groups,
                                        self.kv_cache_config)
        post = self._postprocess(batch, [rows[r] for r in order])
        plans = []
        for mixer, layer in (("gdn", GDN_LAYER), ("mamba2", MAMBA2_LAYER)):
            interpret = v1._interpret_gdn if mixer == "gdn" else v1._interpret_mamba2
            for i, (rid, kind, has_init, read_col, acc, writes, ckpt) in enumerate(
                    interpret(metadata[layer], [rows[r] for r in order], self.spec.block_size)):
                table = rows[rid].block_ids
                plans.append(RowPlan(
                    runner=self.runner, mixer=mixer, req_id=rid, batch_row=i, kind=kind,
                    has_initial_state=has_init, read_column=read_col,
                    read_block=None if read_col is None else v1._block(table, read_col),
                    num_accepted=acc, writes=writes, checkpoint_offset=ckpt,
                    pre_copies=pre.get(rid, ()), post_copies=post.get(rid, ()),
                ))
        return plans

    # ---- reconstructed runner glue -------------------------------------------------------
    def _sync_slots(self, step: StepInput) -> None:
        """finish_requests (finished and preempted free their slot), add_requests (new and
        resumed requests get a slot and MambaHybridModelState.add_request), update_requests."""
        owner = self.base.requests
        for rid in sorted(step.finished | step.preempted):
            if rid in self.slots:
                self.ms.remove_request(rid)
                self.slots.pop(rid)
                owner.pop(rid, None)
        free = [i for i in range(self.max_num_reqs) if i not in self.slots.values()]
        for r in step.rows:
            if r.req_id not in self.slots or r.req_id in step.resumed:
                slot = self.slots.get(r.req_id, free.pop())  # RequestState.add_request pops a free index
                self.slots[r.req_id] = slot
                self.prefill_len[slot] = r.num_prompt_tokens
                self.ms.add_request(slot, SimpleNamespace(num_computed_tokens=r.num_computed))
            slot = self.slots[r.req_id]
            self.num_computed[slot] = r.num_computed
            self.slot_table[slot].zero_()
            self.slot_table[slot, :len(r.block_ids)] = torch.tensor(r.block_ids, dtype=torch.int32)
            owner[r.req_id] = SimpleNamespace(block_ids=(list(r.block_ids),))  # for copy attribution

    def _input_batch(self, rows: list[RowInput]) -> SimpleNamespace:
        """The InputBatch fields preprocess_state and prepare_attn read (gpu/input_batch.py)."""
        n = len(rows)
        idx = np.array([self.slots[r.req_id] for r in rows], dtype=np.intp)
        sched = np.array([r.num_scheduled for r in rows], dtype=np.int32)
        qsl = np.zeros(n + 1, dtype=np.int32)
        qsl[1:] = np.cumsum(sched)
        seq_lens = torch.tensor([r.num_computed + r.num_scheduled for r in rows], dtype=torch.int32)
        prefill_len = self.prefill_len[idx]
        computed_prefill = np.minimum(np.array([r.num_computed for r in rows], dtype=np.int32), prefill_len)
        is_prefilling = computed_prefill < prefill_len
        num_drafts = np.array([r.num_drafts for r in rows], dtype=np.int32)
        runs_as_decode = None
        if is_prefilling.any():  # model_runner.py:1322-1331
            runs_as_decode = is_prefilling & ((sched - num_drafts) == 1) & (computed_prefill > 0)
        for i in range(n):
            self.batch_table[i] = self.slot_table[idx[i]]
        return SimpleNamespace(
            num_reqs=n, num_tokens=int(qsl[-1]), num_reqs_after_padding=n, num_tokens_after_padding=int(qsl[-1]),
            idx_mapping=torch.from_numpy(idx.astype(np.int64)), query_start_loc=torch.from_numpy(qsl.copy()),
            query_start_loc_np=qsl, max_query_len=None, num_scheduled_tokens=sched,
            seq_lens=seq_lens, seq_lens_cpu_upper_bound=seq_lens.clone(), dcp_local_seq_lens=None,
            positions=None, prompt_lens=None, is_prefilling_np=is_prefilling,
            prefill_runs_as_decode_np=runs_as_decode,
            num_draft_tokens_per_req=num_drafts if num_drafts.any() else None,
        )

    def _postprocess(self, batch: SimpleNamespace, rows: list[RowInput]) -> dict[str, tuple[tuple[int, int], ...]]:
        """post_update advances num_computed_tokens by the scheduled tokens less the rejected
        drafts; then MambaHybridModelState.postprocess_state (accepted counts, aligned copy)."""
        num_sampled = torch.tensor([r.num_sampled if r.samples else 0 for r in rows], dtype=torch.int32)
        for r, sampled in zip(rows, num_sampled.tolist(), strict=True):
            rejected = r.num_drafts - (sampled - 1) if r.num_drafts and sampled else 0
            self.num_computed[self.slots[r.req_id]] = r.num_computed + r.num_scheduled - rejected
        return self.base._observe_copies(lambda: self.ms.postprocess_state(
            batch.idx_mapping, num_sampled, self.num_computed), [r.req_id for r in rows])


