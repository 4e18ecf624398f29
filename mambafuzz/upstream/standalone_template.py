"""The body of an exported test (`mambafuzz export-test`): a standalone pytest in the style of
vLLM's tests/v1/core that uses only vLLM's own APIs. Kept as text, filled by mambafuzz/upstream/export.py;
nothing in it may import mambafuzz, so it can be pasted into vLLM's tree."""

TEMPLATE = r'''"""{title}

Exported by mambafuzz from {case_name} (signature {signature}).
Fails on the unmodified vLLM; passes with the candidate fix applied.
{why}
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

ENGINE = json.loads({engine!r})
REQUESTS = json.loads({requests!r})  # id, arrival/abort step, prompt ids, max tokens, connector tokens
NUM_BLOCKS = {num_blocks}
MAX_MODEL_LEN = {max_model_len}
MAX_STEPS = {max_steps}
CHECK = {check!r}
MODEL_CONFIG = json.loads({model_config!r})
ATTN_LAYER = "model.layers.3.self_attn.attn"
MAMBA_LAYERS = [f"model.layers.{{i}}.linear_attn" for i in range(3)]


class ScriptedConnector(KVConnectorBase_V1, SupportsHMA):
    """A scheduler-side KV connector that reports the scripted external tokens; an async load
    completes in the step that scheduled it."""

    plan = {{r["id"]: (r["external"], r["external_async"]) for r in REQUESTS if r["external"]}}
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
                                       is_encoder_decoder=False, enable_chunked_prefill=True{scheduler_policy})
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
    groups = _get_kv_cache_groups_uniform_page_size({{ATTN_LAYER: attn, **dict.fromkeys(MAMBA_LAYERS, mamba)}})
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
    out = {{end}}
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
                f"step {{step}}: mamba block {{block.block_id}} (column {{column}} of {{rid}}) is published as "
                f"the state after {{claimed}} tokens, but {{rid}}'s states were only left at "
                f"{{sorted(written.get(rid, ()))}} (chunk ends, loads, checkpoints)")


{resource_helpers}def test_{test_name}(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    sys.modules.setdefault(__name__, importlib.import_module(__name__))
    init_none_hash(sha256)
    scheduler, hash_block_size = make_scheduler(tmp_path)
    hasher = get_request_block_hasher(hash_block_size, sha256)
    manager = mamba_manager(scheduler) if ENGINE["enable_prefix_caching"] else None
    requests, written, published = {{}}, {{}}, set()
{resource_setup}    for step in range(MAX_STEPS):
        for r in REQUESTS:
            if r["arrival"] == step:
                req = Request(request_id=r["id"], prompt_token_ids=list(r["prompt"]),
                              sampling_params=SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True,
                                                             temperature=0.0),
                              pooling_params=None, arrival_time=float(step), block_hasher=hasher{request_priority})
                requests[r["id"]] = req
                scheduler.add_request(req)
        aborts = [r["id"] for r in REQUESTS if r["abort"] == step and r["id"] in requests]
        if aborts:
            scheduler.finish_requests(aborts, RequestStatus.FINISHED_ABORTED)
        if step > max(r["arrival"] for r in REQUESTS) and not scheduler.has_unfinished_requests():
            break
        out = scheduler.schedule()  # CHECK "no_crash": vLLM must not raise here
        ids = list(out.num_scheduled_tokens)
{resource_after_schedule}        # schedule() already advanced num_computed_tokens past this step's chunk
        starts = {{rid: requests[rid].num_computed_tokens - n for rid, n in out.num_scheduled_tokens.items()}}
        if CHECK == "fresh_prompt_not_spec_row":
            for rid in out.scheduled_spec_decode_tokens:
                assert starts[rid] > 0, (f"step {{step}}: {{rid}} has no computed tokens but is scheduled as a "
                                   "speculative row: the recurrent spec-decode kernels have no initial-state "
                                   "mask, so it starts from its (never zeroed) mamba block")
        sampled = []
        for rid in ids:
            req = requests[rid]
            start, end = starts[rid], starts[rid] + out.num_scheduled_tokens[rid]
            if manager is not None:
                # A first chunk starts from what a prefix hit or a connector load left (its own length).
                positions = written.setdefault(rid, {{start}})
                positions |= written_positions(scheduler, manager, start, end)
            sampled.append([1] if end >= req.num_tokens else [])
        if CHECK == "published_state_written":  # blocks are published at schedule time
            check_published(step, manager, written, published)
        done = set(scheduler.connector.loading)
        scheduler.connector.loading.clear()
        scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, {row_index}sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(finished_recving=done) if done else None))
        if CHECK == "published_state_written":
            check_published(step, manager, written, published)
{resource_after_update}    assert not scheduler.has_unfinished_requests()
{resource_at_end}'''


# The resource assertions' code, in a test only where its CHECK needs it (pasted into TEMPLATE's
# placeholders, by mambafuzz/upstream/export.py), so the other exports stay as they were.
RESOURCE_HELPERS = r'''def check_pool(step, pool):
    """The pool's own counts: the free queue holds exactly the blocks no request references (the
    null block aside), and no count is negative (vllm/v1/core/block_pool.py free_blocks, touch)."""
    counts = [block.ref_cnt for block in pool.blocks if not block.is_null]
    assert min(counts) >= 0, f"step {step}: {sum(c < 0 for c in counts)} block(s) have a negative reference count"
    assert pool.get_num_free_blocks() == counts.count(0), (
        f"step {step}: the pool reports {pool.get_num_free_blocks()} free blocks but {counts.count(0)} of its "
        f"{len(counts)} usable blocks have no reference")


def start_up_reserve(scheduler):
    """The blocks vLLM's start-up check reserves in each KV-cache group for one request of
    MAX_MODEL_LEN tokens: each group is charged cdiv(max_memory_usage_bytes, page size) whole blocks
    (get_kv_cache_configs -> _max_memory_usage_bytes_from_groups), and the null block is held back."""
    import copy

    sized = copy.copy(scheduler.vllm_config)
    sized.model_config = copy.copy(sized.model_config)
    sized.model_config.max_model_len = MAX_MODEL_LEN
    reserve = [-(-g.kv_cache_spec.max_memory_usage_bytes(sized) // g.kv_cache_spec.page_size_bytes)
               for g in scheduler.kv_cache_config.kv_cache_groups]
    assert NUM_BLOCKS >= sum(reserve) + 1, "a pool vLLM's start-up check refuses: it promises nothing"
    return reserve


def lone_holder(scheduler):
    """The request holding blocks alone, with its blocks per group (null blocks aside), when its
    tables hold every block in use; else None."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    holders = {rid for m in managers for rid, blocks in m.req_to_blocks.items() if blocks}
    if len(holders) != 1:
        return None
    (rid,) = holders
    held = [sum(not b.is_null for b in m.req_to_blocks.get(rid, ())) for m in managers]
    in_use = NUM_BLOCKS - 1 - scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    return (rid, held) if sum(held) == in_use else None


'''

# CHECK "lone_request_within_reserve": the reserve before the first step, the sole holder after each
RESERVE_SETUP = """    reserve = start_up_reserve(scheduler)
    alone = None
"""
RESERVE_AFTER_SCHEDULE = """        if alone is not None:
            assert alone[0] not in out.preempted_req_ids, (
                f"step {step}: {alone[0]} was preempted while it was the only request holding blocks, on a "
                "pool vLLM's start-up check accepts as holding one request of max_model_len alone")
"""
RESERVE_AFTER_UPDATE = """        alone = lone_holder(scheduler)
        if alone is not None:
            for group, (held, most) in enumerate(zip(alone[1], reserve)):
                assert held <= most, (
                    f"step {step}: {alone[0]}, the only request holding blocks, holds {held} blocks in "
                    f"KV-cache group {group} where vLLM's start-up check reserved {most}")
"""
# CHECK "pool_counts_consistent": the pool's counts after each step, and all free at the end
POOL_AFTER_UPDATE = """        check_pool(step, scheduler.kv_cache_manager.block_pool)
"""
POOL_AT_END = """    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == NUM_BLOCKS - 1
"""
