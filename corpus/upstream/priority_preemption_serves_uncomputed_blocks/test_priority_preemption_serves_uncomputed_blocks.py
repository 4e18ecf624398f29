"""Under priority scheduling, a request preempted after schedule() gave it blocks leaves them keyed, and a later hit serves K/V and a state no forward wrote

Exported by mambafuzz from priority_preemption_serves_uncomputed_blocks.json (signature slot_hash:never-written/unwritten).
Fails on the unmodified vLLM; passes with the candidate fix applied.

Driven through vLLM's real Scheduler and KV-cache manager, no model: every row samples one
token and no drafts are proposed.
"""

import importlib
import json
import sys

import torch
from vllm.config import (
    CacheConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (
    _get_kv_cache_groups_uniform_page_size,
    get_request_block_hasher,
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import MambaManager
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    MambaSpec,
    get_mamba_prefill_checkpoint_position,
    is_mamba_prefill_checkpoint_valid,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

ENGINE = json.loads('{"mamba_block_size": 8, "attn_block_size": 8, "prefix_match_unit": null, "max_num_batched_tokens": 16, "long_prefill_token_threshold": 8, "max_num_seqs": 2, "num_gpu_blocks": 20, "spec_method": "none", "num_speculative_tokens": 0, "num_prefill_checkpoint_blocks": 0, "prefill_checkpoint_alignment": null, "enable_mamba_shared_prefix_checkpoint": false, "prefix_cache_retention_interval": 0, "enable_prefix_caching": true, "pipeline_parallel_size": 1, "model": "tiny_qwen3_next"}')
REQUESTS = json.loads('[{"id": "r0", "arrival": 0, "prompt": [780, 158, 981, 409, 185, 386, 777, 788, 34, 120, 248, 64, 845, 849, 65, 64, 306, 182, 724, 430, 322, 246, 264, 778, 394, 477, 808, 35, 418, 757, 727, 611, 672, 991, 634, 376, 574, 29, 952, 192, 584, 899, 781, 230, 549, 548, 1015, 41, 387, 466, 742, 736, 932, 724, 23, 702, 821, 806, 896, 318, 790, 323, 410, 180, 694], "max_tokens": 1, "external": 0, "external_async": false, "abort": null, "priority": 1}, {"id": "r1", "arrival": 3, "prompt": [990, 746, 557, 900, 638, 572, 467, 815], "max_tokens": 2, "external": 0, "external_async": false, "abort": null, "priority": 0}]')  # id, arrival/abort step, prompt ids, max tokens, connector tokens
NUM_BLOCKS = 20
MAX_MODEL_LEN = 67
MAX_STEPS = 111
CHECK = 'published_state_written'
MODEL_CONFIG = json.loads('{"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"], "full_attention_interval": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": true, "max_position_embeddings": 16384, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "hidden_act": "silu", "tie_word_embeddings": false, "torch_dtype": "bfloat16", "num_nextn_predict_layers": 1, "bos_token_id": 1, "eos_token_id": 0, "initializer_range": 0.2}')
ATTN_LAYER = "model.layers.3.self_attn.attn"
MAMBA_LAYERS = [f"model.layers.{i}.linear_attn" for i in range(3)]


class ScriptedConnector(KVConnectorBase_V1, SupportsHMA):
    """A scheduler-side KV connector that reports the scripted external tokens; an async load
    completes in the step that scheduled it."""

    plan = {r["id"]: (r["external"], r["external_async"]) for r in REQUESTS if r["external"]}
    loading: set = set()

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        tokens, load_async = self.plan.get(request.request_id, (0, False))
        extra = max(0, min(tokens, request.num_prompt_tokens - 1) - num_computed_tokens)
        return extra, load_async and extra > 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens > 0 and self.plan[request.request_id][1]:
            self.loading.add(request.request_id)

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    def request_finished(self, request, block_ids):
        return False, None

    def request_finished_all_groups(self, request, block_ids):
        return False, None

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass


def make_scheduler(model_dir):
    e = ENGINE
    caching = e["enable_prefix_caching"]
    model_config = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=16384)
    cache_config = CacheConfig(block_size=e["mamba_block_size"], enable_prefix_caching=caching,
                               mamba_cache_mode="align" if caching else "none",
                               prefix_match_unit=e["prefix_match_unit"] if caching else None,
                               enable_mamba_shared_prefix_checkpoint=e["enable_mamba_shared_prefix_checkpoint"],
                               prefix_cache_retention_interval=e["prefix_cache_retention_interval"])
    scheduler_config = SchedulerConfig(max_num_batched_tokens=e["max_num_batched_tokens"],
                                       max_num_seqs=e["max_num_seqs"], max_model_len=MAX_MODEL_LEN,
                                       long_prefill_token_threshold=e["long_prefill_token_threshold"],
                                       is_encoder_decoder=False, enable_chunked_prefill=True, policy="priority")
    spec = e["num_speculative_tokens"] if e["spec_method"] != "none" else 0
    speculative_config = None
    if spec:
        speculative_config = SpeculativeConfig(method=e["spec_method"], num_speculative_tokens=spec,
                                               target_model_config=model_config,
                                               target_parallel_config=ParallelConfig())
    vllm_config = VllmConfig(model_config=model_config, cache_config=cache_config,
                             scheduler_config=scheduler_config, speculative_config=speculative_config,
                             kv_transfer_config=KVTransferConfig(kv_connector="ScriptedConnector",
                                                                 kv_connector_module_path=__name__,
                                                                 kv_role="kv_both"))
    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    attn = FullAttentionSpec(block_size=e["attn_block_size"], num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    mamba = MambaSpec(block_size=e["mamba_block_size"], shapes=((1, 1),), dtypes=(torch.float32,),
                      mamba_cache_mode="align" if caching else "none", num_speculative_blocks=spec,
                      num_prefill_checkpoint_blocks=e["num_prefill_checkpoint_blocks"] if caching else 0,
                      prefill_checkpoint_alignment=e["prefill_checkpoint_alignment"] if caching else None,
                      page_size_padded=attn.page_size_bytes)
    groups = _get_kv_cache_groups_uniform_page_size({ATTN_LAYER: attn, **dict.fromkeys(MAMBA_LAYERS, mamba)})
    kv_cache_config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=groups,
                                    prefix_cache_retention_interval=e["prefix_cache_retention_interval"])
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    scheduler = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                          structured_output_manager=StructuredOutputManager(vllm_config),
                          block_size=block_size, hash_block_size=hash_block_size)
    return scheduler, hash_block_size


def mamba_manager(scheduler):
    return next(m for m in scheduler.kv_cache_manager.coordinator.single_type_managers
                if isinstance(m, MambaManager))


def written_positions(scheduler, manager, start, end):
    """Where a prefill chunk start..end leaves a state: its end, and the internal checkpoint
    when the mixer exports one (the rule of compute_mamba_prefill_checkpoints)."""
    out = {end}
    alignment = ENGINE["prefill_checkpoint_alignment"]
    if ENGINE["num_prefill_checkpoint_blocks"] and alignment:
        position = get_mamba_prefill_checkpoint_position(end, manager.cache_hit_alignment_tokens,
                                                         bool(getattr(scheduler, "use_eagle_block_drop", False)))
        if is_mamba_prefill_checkpoint_valid(query_start=start, query_end=end, checkpoint_position=position,
                                             hash_block_size=scheduler.hash_block_size,
                                             mamba_block_size=ENGINE["mamba_block_size"],
                                             checkpoint_alignment=alignment):
            out.add(position)
    return out


def check_published(step, manager, written, published):
    """Every mamba block newly published under a hash claims a position where its request's
    state was actually left."""
    bs = ENGINE["mamba_block_size"]
    for rid, blocks in manager.req_to_blocks.items():
        for column, block in enumerate(blocks):
            if block.block_hash is None or (block.block_id, block.block_hash) in published:
                continue
            published.add((block.block_id, block.block_hash))
            claimed = block.block_hash_num_tokens or (column + 1) * bs
            assert claimed in written.get(rid, ()), (
                f"step {step}: mamba block {block.block_id} (column {column} of {rid}) is published as "
                f"the state after {claimed} tokens, but {rid}'s states were only left at "
                f"{sorted(written.get(rid, ()))} (chunk ends, loads, checkpoints)")


def test_priority_preemption_serves_uncomputed_blocks(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    sys.modules.setdefault(__name__, importlib.import_module(__name__))
    init_none_hash(sha256)
    scheduler, hash_block_size = make_scheduler(tmp_path)
    hasher = get_request_block_hasher(hash_block_size, sha256)
    manager = mamba_manager(scheduler) if ENGINE["enable_prefix_caching"] else None
    requests, written, published = {}, {}, set()
    for step in range(MAX_STEPS):
        for r in REQUESTS:
            if r["arrival"] == step:
                req = Request(request_id=r["id"], prompt_token_ids=list(r["prompt"]),
                              sampling_params=SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True,
                                                             temperature=0.0),
                              pooling_params=None, arrival_time=float(step), block_hasher=hasher, priority=r["priority"])
                requests[r["id"]] = req
                scheduler.add_request(req)
        aborts = [r["id"] for r in REQUESTS if r["abort"] == step and r["id"] in requests]
        if aborts:
            scheduler.finish_requests(aborts, RequestStatus.FINISHED_ABORTED)
        if step > max(r["arrival"] for r in REQUESTS) and not scheduler.has_unfinished_requests():
            break
        out = scheduler.schedule()  # CHECK "no_crash": vLLM must not raise here
        ids = list(out.num_scheduled_tokens)
        # schedule() already advanced num_computed_tokens past this step's chunk
        starts = {rid: requests[rid].num_computed_tokens - n for rid, n in out.num_scheduled_tokens.items()}
        if CHECK == "fresh_prompt_not_spec_row":
            for rid in out.scheduled_spec_decode_tokens:
                assert starts[rid] > 0, (f"step {step}: {rid} has no computed tokens but is scheduled as a "
                                   "speculative row: the recurrent spec-decode kernels have no initial-state "
                                   "mask, so it starts from its (never zeroed) mamba block")
        sampled = []
        for rid in ids:
            req = requests[rid]
            start, end = starts[rid], starts[rid] + out.num_scheduled_tokens[rid]
            if manager is not None:
                # A first chunk starts from what a prefix hit or a connector load left (its own length).
                positions = written.setdefault(rid, {start})
                positions |= written_positions(scheduler, manager, start, end)
            sampled.append([1] if end >= req.num_tokens else [])
        if CHECK == "published_state_written":  # blocks are published at schedule time
            check_published(step, manager, written, published)
        done = set(scheduler.connector.loading)
        scheduler.connector.loading.clear()
        scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(finished_recving=done) if done else None))
        if CHECK == "published_state_written":
            check_published(step, manager, written, published)
    assert not scheduler.has_unfinished_requests()
