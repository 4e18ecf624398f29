"""Where each vLLM name the project uses lives, release by release: a name maps to the places
to try, newest first. Adding a release that moves something means adding one place here."""

from __future__ import annotations

from dataclasses import dataclass

_KVU = "vllm.v1.core.kv_cache_utils"
_KVI = "vllm.v1.kv_cache_interface"
_CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.base"


@dataclass(frozen=True)
class Place:
    module: str
    attr: str | None  # None: the module itself


def _at(module: str, *names: str) -> dict[str, tuple[Place, ...]]:
    return {n: (Place(module, n),) for n in names}


SYMBOLS: dict[str, tuple[Place, ...]] = {
    **_at("vllm.config", "CacheConfig", "KVTransferConfig", "ModelConfig", "ParallelConfig", "SchedulerConfig",
          "SpeculativeConfig", "VllmConfig"),
    **_at("vllm.config.speculative", "EagleModelTypes"),
    **_at("vllm.sampling_params", "SamplingParams"),
    "sha256": (Place("vllm.utils.hashing", "sha256"), Place("vllm.utils", "sha256")),
    **_at(_KVU, "KVCacheBlock", "get_block_hash", "get_group_id", "get_request_block_hasher", "init_none_hash",
          "make_block_hash_with_group_id", "resolve_kv_cache_block_sizes"),
    # 0.33 moved the grouping into kv_cache_planning.
    "get_kv_cache_groups_uniform_page_size": (
        Place("vllm.v1.core.kv_cache_planning", "_get_kv_cache_groups_uniform_page_size"),
        Place(_KVU, "_get_kv_cache_groups_uniform_page_size"),
    ),
    **_at("vllm.v1.core.sched.output", "SchedulerOutput"),
    **_at("vllm.v1.core.sched.scheduler", "Scheduler"),
    **_at("vllm.v1.core.single_type_kv_cache_manager", "MambaManager"),
    **_at("vllm.v1.core.block_pool", "BlockPool"),
    **_at("vllm.v1.core.kv_cache_manager", "KVCacheManager"),
    **_at(_KVI, "SlidingWindowSpec"),
    # The architectures (mambafuzz/sim/bridge/architectures.py): each model class's own state-shape and dtype functions.
    **_at("vllm.model_executor.layers.mamba.mamba_utils", "MambaStateDtypeCalculator"),
    **_at("vllm.model_executor.models.qwen3_next", "Qwen3NextForCausalLM"),
    **_at("vllm.model_executor.models.qwen3_5", "Qwen3_5MoeForCausalLM"),
    **_at("vllm.model_executor.models.nemotron_h", "NemotronHForCausalLM"),
    **_at("vllm.model_executor.models.granitemoehybrid", "GraniteMoeHybridForCausalLM"),
    **_at("vllm.model_executor.models.falcon_h1", "FalconH1ForCausalLM"),
    **_at(_KVI, "FullAttentionSpec", "KVCacheConfig", "KVCacheGroupSpec", "MambaSpec",
          "get_mamba_prefill_checkpoint_position", "is_mamba_prefill_checkpoint_valid"),
    **_at("vllm.v1.outputs", "DraftTokenIds", "KVConnectorOutput", "ModelRunnerOutput"),
    **_at("vllm.v1.request", "Request", "RequestStatus"),
    **_at("vllm.v1.structured_output", "StructuredOutputManager"),
    **_at(_CONNECTOR, "KVConnectorBase_V1", "KVConnectorMetadata", "KVConnectorRole", "SupportsHMA"),
    # Modules patched in place (planted bugs) or measured (coverage).
    "vllm_package": (Place("vllm", None),),
    "scheduler_module": (Place("vllm.v1.core.sched.scheduler", None),),
    "single_type_manager_module": (Place("vllm.v1.core.single_type_kv_cache_manager", None),),
    # The engine tier (a real LLMEngine on CPU).
    **_at("vllm.engine.arg_utils", "EngineArgs"),
    **_at("vllm.v1.engine.llm_engine", "LLMEngine"),
    **_at("vllm.platforms.cpu", "CpuPlatform"),
    **_at("vllm.model_executor.layers.mamba.mamba_utils", "MambaStateShapeCalculator", "get_temporal_copy_spec"),
    # The conformance tier: vLLM's own model-runner (worker) code, called on CPU.
    **_at("vllm.config.compilation", "CUDAGraphMode"),
    **_at("vllm.config", "set_current_vllm_config"),
    **_at("vllm.v1.attention.backend", "CommonAttentionMetadata"),
    **_at("vllm.v1.attention.backends.gdn_attn", "GDNAttentionMetadataBuilder"),
    **_at("vllm.v1.attention.backends.mamba2_attn", "Mamba2AttentionMetadataBuilder"),
    **_at("vllm.v1.attention.backends.registry", "MambaAttentionBackendEnum"),
    **_at("vllm.v1.attention.backends.utils", "reorder_batch_to_split_decodes_and_prefills"),
    **_at("vllm.v1.utils", "CpuGpuBuffer"),
    **_at("vllm.v1.worker.gpu_input_batch", "CachedRequestState", "InputBatch"),
    **_at("vllm.v1.worker.gpu.model_runner", "sort_batch_req_ids"),
    **_at("vllm.v1.worker.gpu.model_states.mamba_hybrid", "MambaHybridModelState"),
    "worker_mamba_utils": (Place("vllm.v1.worker.mamba_utils", None),),
    "triton_utils_module": (Place("vllm.triton_utils", None),),
    # The platform whose config check the bridge may have to build past (platform_gate.py).
    "platforms_module": (Place("vllm.platforms", None),),
}

# Names a release may lack without losing the scheduler harness: only inputs that need them
# are refused (see features.py). Before 0.30 the prefill-checkpoint rule lived inside
# MambaManager, with no function the kernel model can follow.
# Model Runner V1's worker code is gone in 0.34 (no gpu_input_batch.py): only V1 inputs (refused there by
# the bridge), the V1 accepted-count probe (features.has_v1_accepted_probe) and `conform --runner v1` use it.
OPTIONAL = frozenset({"get_mamba_prefill_checkpoint_position", "is_mamba_prefill_checkpoint_valid", "EagleModelTypes",
                      "CachedRequestState", "InputBatch", "reorder_batch_to_split_decodes_and_prefills"})
# Model classes whose state-shape functions mambafuzz/sim/bridge/architectures.py calls: resolved only when a scenario
# names their architecture (importing them costs seconds, and one may not import on a CPU host).
MODEL_CLASSES = frozenset({"Qwen3NextForCausalLM", "Qwen3_5MoeForCausalLM", "NemotronHForCausalLM",
                           "GraniteMoeHybridForCausalLM", "FalconH1ForCausalLM"})
# Only the engine tier (a real LLMEngine) needs these; the scheduler harness runs without them.
ENGINE_TIER = frozenset({"EngineArgs", "LLMEngine", "MambaStateShapeCalculator", "CpuPlatform"})
