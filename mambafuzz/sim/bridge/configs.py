"""What an engine builds before its scheduler, built as vLLM's engine builds it: the `VllmConfig`
(with the scenario's KV connector and speculative config), the KV-cache groups and `KVCacheConfig`
of a registered architecture, the block sizes the engine core resolves, and the start-up budget
(the smallest pool vLLM starts with, each group's reserve). Config knobs a release lacks are
dropped when left off, and refuse the input otherwise. Its vLLM names come from
`mambafuzz.sim.bridge.vllm_compat` (where each release keeps them); a vLLM upgrade starts in
mambafuzz/sim/bridge/vllm_compat/symbols.py, then here and in `scheduler_session`.

Importing it sets vLLM's offline and logging environment and its block-hash seed, once per process.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import types
import typing
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from mambafuzz.model import runners  # noqa: E402
from mambafuzz.model.architectures import DEFAULT_MODEL  # noqa: E402
from mambafuzz.model.scenario import EngineConfig, knobs  # noqa: E402
from mambafuzz.sim.bridge import architectures  # noqa: E402
from mambafuzz.sim.bridge.vllm_compat import features, platform_gate  # noqa: E402
from mambafuzz.sim.bridge.vllm_compat.api import (  # noqa: E402
    CacheConfig,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVTransferConfig,
    MambaSpec,
    ModelConfig,
    ModelRunnerOutput,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
    get_kv_cache_groups_uniform_page_size,
    get_mamba_prefill_checkpoint_position,
    init_none_hash,
    is_mamba_prefill_checkpoint_valid,
    platforms_module,
    sha256,
    triton_utils_module,
)
from mambafuzz.sim.bridge.vllm_compat.resolve import describe_vllm  # noqa: E402

for _name in ("vllm", "vllm.config", "vllm.v1"):
    logging.getLogger(_name).setLevel(logging.ERROR)

TINY_MODEL_DIR = Path(__file__).parents[2] / "tiny_model"
CONNECTOR_MODULE = "mambafuzz.sim.engine.connector"
CONNECTOR_CLASS = "ScenarioConnector"
ATTN_LAYER = "model.layers.3.self_attn.attn"
MAMBA_LAYERS = [f"model.layers.{i}.linear_attn" for i in range(3)]

init_none_hash(sha256)

VLLM = describe_vllm(with_path=False)  # per-input messages; `mambafuzz --version` gives the path
# Knob values that mean "this release's own behaviour", so a release without the knob can run
# inputs that leave it there. Retention 0 is "vLLM's default": dense on releases before the knob.
OFF_VALUES: dict[str, tuple] = {
    "enable_mamba_shared_prefix_checkpoint": (False,),
    "prefix_cache_retention_interval": (0, None),
    "num_prefill_checkpoint_blocks": (0,),
    "prefill_checkpoint_alignment": (None,),
}
PREFILL_CHECKPOINTS = features.has_prefill_checkpoint_rule(
    MambaSpec, get_mamba_prefill_checkpoint_position, is_mamba_prefill_checkpoint_valid)
RUNNER_CHOICE = features.has_runner_choice(VllmConfig)  # False from 0.34 on: Model Runner V2 only
ROW_INDEX_FIELD = "req_id_to_index" in features.init_params(ModelRunnerOutput)  # False from 0.34 on


@lru_cache(maxsize=1)
def tiny_model_config() -> ModelConfig:
    # One ModelConfig per process: the first build costs seconds, and its max_model_len
    # only bounds the scheduler configs built from it.
    return ModelConfig(model=str(TINY_MODEL_DIR), skip_tokenizer_init=True, max_model_len=16384)


_BUILD_KEY_FIELDS = tuple(name for name, k in knobs().items() if k.build_key)


def engine_key(e: EngineConfig, max_model_len: int, connector: bool = True) -> tuple:
    """What a VllmConfig built from `e` depends on (the knobs declared `build_key`)."""
    return (*(getattr(e, name) for name in _BUILD_KEY_FIELDS), e.hash_block_size, max_model_len, connector)


_VLLM_CONFIGS: dict[tuple, VllmConfig] = {}
MAX_CACHED_CONFIGS = 32


class ConfigRejected(ValueError):
    """vLLM's own config validation refused the scenario's engine config (bad input, not a finding)."""


def vllm_config_for(e: EngineConfig, max_model_len: int, connector: bool = True) -> VllmConfig:
    """Build (once per distinct config in this process) the VllmConfig vLLM would use; with
    `connector`, the scenario's KV connector (mambafuzz.sim.engine.connector) is configured as a consumer."""
    key = engine_key(e, max_model_len, connector)
    if key in _VLLM_CONFIGS:
        _VLLM_CONFIGS[key] = _VLLM_CONFIGS.pop(key)  # most recently used last
        return _VLLM_CONFIGS[key]
    model_config = tiny_model_config()
    cache_config = CacheConfig(**features.fit_kwargs(CacheConfig, dict(
        block_size=e.mamba_block_size,
        enable_prefix_caching=e.enable_prefix_caching,
        mamba_cache_mode="align" if e.enable_prefix_caching else "none",
        prefix_match_unit=e.prefix_match_unit if e.enable_prefix_caching else None,
        enable_mamba_shared_prefix_checkpoint=e.enable_mamba_shared_prefix_checkpoint,
        prefix_cache_retention_interval=e.prefix_cache_retention_interval,
    ), OFF_VALUES, VLLM))
    scheduler_config = SchedulerConfig(
        max_num_batched_tokens=e.max_num_batched_tokens,
        max_num_seqs=e.max_num_seqs,
        max_model_len=max_model_len,
        long_prefill_token_threshold=e.long_prefill_token_threshold,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        policy=e.scheduling_policy,
    )
    speculative_config = None
    if e.uses_spec_decode:
        speculative_config = SpeculativeConfig(
            method=e.spec_method,
            num_speculative_tokens=e.num_speculative_tokens,
            target_model_config=model_config,
            target_parallel_config=ParallelConfig(),
        )
    # A deployment without a connector has none: with one (a KV consumer) and batches in flight,
    # vLLM defers block frees and will not preempt a request whose blocks an in-flight step may
    # still write (Scheduler.defer_block_free), so an idle connector would hide the async preemption
    # and stale-delivery paths from every scenario.
    kv_transfer_config = KVTransferConfig(
        kv_connector=CONNECTOR_CLASS, kv_connector_module_path=CONNECTOR_MODULE, kv_role="kv_both",
        **({} if e.connector_failure_policy == "fail" else {"kv_load_failure_policy": e.connector_failure_policy}),
    ) if connector else None
    # vLLM 0.34's CPU platform check refuses x86 without triton-cpu (platforms/cpu.py:243); the
    # harness runs no kernel, so the config is built past that one gate (platform_gate.py).
    vc = platform_gate.build_past_triton_gate(lambda: VllmConfig(
        model_config=model_config,
        cache_config=cache_config,
        scheduler_config=scheduler_config,
        speculative_config=speculative_config,
        kv_transfer_config=kv_transfer_config,
        # The scheduler reads the stage count (use_pp, AsyncScheduler.decode_stagger) and the engine
        # core its batch-queue depth (max_concurrent_batches); one unified KV-cache config stands for
        # the stages' (the scheduler sees one).
        parallel_config=ParallelConfig(pipeline_parallel_size=e.pipeline_parallel_size),
    ), type(platforms_module.current_platform), triton_utils_module)
    # vLLM resolves `async_scheduling` (None: its default) in VllmConfig, and then CpuPlatform.
    # check_and_update_config turns it off on a CPU host (platforms/cpu.py: "not required on CPU").
    # The scheduler under test is the one a CUDA host runs, so the mode is set here, after both:
    # the Scheduler reads it (max_concurrent_batches: deferred block frees, in-flight token bound).
    vc.scheduler_config.async_scheduling = (default_async_scheduling(vc, e.runner or default_runner(vc))
                                            if e.async_scheduling is None else e.async_scheduling)
    if e.block_size_from_groups:
        vc.cache_config.mamba_block_size = mamba_block_for(e, max_model_len)
        vc.cache_config.block_size = engine_core_block_size(kv_cache_config_for(e, 1, max_model_len).kv_cache_groups)
    _VLLM_CONFIGS[key] = vc
    while len(_VLLM_CONFIGS) > MAX_CACHED_CONFIGS:  # a long run draws endless distinct configs
        _VLLM_CONFIGS.pop(next(iter(_VLLM_CONFIGS)))
    return vc


def default_runner(vc: VllmConfig) -> str:
    """The model runner vLLM 0.32 runs this config with on a CUDA host: `VllmConfig.
    use_v2_model_runner` picks V2 unless `_get_v2_model_runner_unsupported_features` names
    something (MTP is not named). Mirrored, because the property itself answers V1 on this
    CPU build for a reason a CUDA host does not have (no Triton); VLLM_USE_V2_MODEL_RUNNER is
    not consulted: a scenario that wants V1 says `runner: "v1"`. The flag maps back to a runner
    through the registry (mambafuzz.model.runners.picked_by_vllm). vLLM 0.34 has V2 only."""
    if not RUNNER_CHOICE:
        return runners.picked_by_vllm(True).name
    return runners.picked_by_vllm(not vc._get_v2_model_runner_unsupported_features()).name


def default_async_scheduling(vc: VllmConfig, runner: str) -> bool:
    """What vLLM 0.32 sets `async_scheduling` to when it is left unset, on a CUDA host: the
    `async_scheduling is None` branch of `VllmConfig.__post_init__` (config/vllm.py), mirrored because
    the CPU platform overrides it. On: unless a pooling model (never here), a drafter outside EAGLE/MTP
    (vLLM's own `EagleModelTypes`), a padded-drafter opt-out, an executor without support (uniproc and
    multiprocessing support it), or `runner` V1 with pipeline parallelism."""
    spec = vc.speculative_config
    if spec is not None:
        try:
            from mambafuzz.sim.bridge.vllm_compat.api import EagleModelTypes
            eagle_like = set(_literal_values(EagleModelTypes))
        except Exception:  # a release without the alias: MTP is EAGLE-like in every release here
            eagle_like = {"mtp"}
        if spec.method not in eagle_like or getattr(spec, "disable_padded_drafter_batch", False):
            return False
    return vc.parallel_config.pipeline_parallel_size <= 1 or runners.get(runner).use_v2_model_runner


def _literal_values(alias: object) -> Iterator[str]:
    """The strings of a (nested) typing.Literal alias."""
    for arg in typing.get_args(alias):
        if isinstance(arg, str):
            yield arg
        else:
            yield from _literal_values(arg)


def batch_queue_depth(vc: VllmConfig, runner: str) -> int:
    """Batches the engine core keeps in flight: vLLM's own `VllmConfig.max_concurrent_batches`
    (2 for V1 without pipeline parallelism, pipeline size + 1 for V2 under async scheduling; 1 when
    synchronous), evaluated for `runner` instead of the runner this CPU host would pick."""
    prop = getattr(type(vc), "max_concurrent_batches", None)
    if prop is None:  # a release before the batch queue: one batch at a time unless async
        return 2 if vc.scheduler_config.async_scheduling else 1
    view = types.SimpleNamespace(parallel_config=vc.parallel_config, scheduler_config=vc.scheduler_config,
                                 use_v2_model_runner=runners.get(runner).use_v2_model_runner)
    return int(prop.fget(view))


def checked_config(e: EngineConfig, max_model_len: int, connector: bool = True) -> VllmConfig:
    if e.enable_prefix_caching and e.num_prefill_checkpoint_blocks and not PREFILL_CHECKPOINTS:
        raise ConfigRejected(f"cannot run on {VLLM}: no prefill-checkpoint rule "
                             "(get_mamba_prefill_checkpoint_position) for num_prefill_checkpoint_blocks > 0")
    if e.runner is not None and not RUNNER_CHOICE and not runners.get(e.runner).use_v2_model_runner:
        raise ConfigRejected(f"cannot run on {VLLM}: no Model Runner V1 (VllmConfig.use_v2_model_runner is gone) "
                             f"for runner {e.runner!r}")
    try:
        return vllm_config_for(e, max_model_len, connector)
    except features.FeatureAbsent as exc:
        raise ConfigRejected(f"cannot run: {exc}") from None
    except Exception as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        detail = next((ln for ln in lines if "error" in ln.lower() and "validation error" not in ln.lower()),
                      lines[0] if lines else type(exc).__name__)
        raise ConfigRejected(f"vLLM refuses this engine config: {detail.split(' [type=')[0]}") from None


@lru_cache(maxsize=64)
def kv_cache_groups_for(attn_block: int, mamba_block: int, caching: bool, spec_blocks: int, checkpoint_blocks: int,
                     checkpoint_alignment: int | None, model: str = DEFAULT_MODEL) -> tuple[KVCacheGroupSpec, ...]:
    """The KV-cache groups for one geometry, built once (vLLM's grouping deep-copies specs: slow). A model
    other than the tiny default gets its layers' specs from mambafuzz.sim.bridge.architectures."""
    if model != DEFAULT_MODEL:
        specs = architectures.layer_specs(model, attn_block, mamba_block, caching, spec_blocks, checkpoint_blocks,
                                          checkpoint_alignment,
                                          lambda kwargs: features.fit_kwargs(MambaSpec, kwargs, OFF_VALUES, VLLM))
        return tuple(get_kv_cache_groups_uniform_page_size(specs))
    attn = FullAttentionSpec(block_size=attn_block, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    mamba_kwargs = dict(block_size=mamba_block, shapes=((1, 1),), dtypes=(torch.float32,),
                        num_speculative_blocks=spec_blocks)
    if caching:
        mamba_kwargs.update(mamba_cache_mode="align", num_prefill_checkpoint_blocks=checkpoint_blocks,
                            prefill_checkpoint_alignment=checkpoint_alignment)
    mamba = MambaSpec(**features.fit_kwargs(MambaSpec, mamba_kwargs, OFF_VALUES, VLLM))
    # Group the layers as the engine does. The engine pads the mamba page to the attention page
    # (Platform._align_hybrid_block_size), then vLLM's uniform-page grouping gives each of the tiny model's
    # three linear-attention layers its own group (one attention layer sets the group size): three mamba
    # block tables per request, as in a real engine, which matters for small-pool admission.
    mamba = dataclasses.replace(mamba, page_size_padded=attn.page_size_bytes)
    return tuple(get_kv_cache_groups_uniform_page_size({ATTN_LAYER: attn, **dict.fromkeys(MAMBA_LAYERS, mamba)}))


def engine_core_block_size(groups: typing.Sequence[KVCacheGroupSpec]) -> int:
    """`cache_config.block_size` as vLLM 0.32's EngineCore sets it once the KV cache is laid out
    (`_initialize_kv_caches`, v1/engine/core.py:341-356): the smallest block of the groups whose
    spec is `prefix_cacheable`, or of all groups when none is. Mirrored: it runs inside the engine
    core's start-up, after the workers profiled memory."""
    cacheable = [g.kv_cache_spec.block_size for g in groups if g.kv_cache_spec.prefix_cacheable]
    return min(cacheable or [g.kv_cache_spec.block_size for g in groups])


def mamba_block_for(e: EngineConfig, max_model_len: int) -> int:
    """The mamba groups' block size. With prefix caching off a real engine sets it to max_model_len
    (model_executor/models/config.py, HybridAttentionMambaModelConfig): one running state per
    request plus its speculative blocks, never a table that grows per block."""
    return e.mamba_block_size if e.enable_prefix_caching else max_model_len


def kv_cache_config_for(e: EngineConfig, num_blocks: int, max_model_len: int) -> KVCacheConfig:
    groups = list(kv_cache_groups_for(e.attn_block_size, mamba_block_for(e, max_model_len), e.enable_prefix_caching,
                                   e.num_speculative_tokens if e.uses_spec_decode else 0,
                                   e.num_prefill_checkpoint_blocks, e.prefill_checkpoint_alignment, e.model))
    # vLLM's KV-cache utilities copy the retention interval from CacheConfig into KVCacheConfig, and the
    # coordinator reads it only from there: without it every run would use dense retention.
    return KVCacheConfig(**features.fit_kwargs(KVCacheConfig, dict(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups,
        prefix_cache_retention_interval=e.prefix_cache_retention_interval if e.enable_prefix_caching else 0),
        OFF_VALUES, VLLM))



def startup_min_blocks(e: EngineConfig, max_model_len: int) -> int:
    """The smallest pool vLLM starts an engine with for this config: its start-up check wants, per
    KV-cache group, the blocks of one request of `max_model_len` tokens at its largest (`startup_budget`),
    beside the null block the pool holds back."""
    try:
        kv_cache_config = kv_cache_config_for(e, 1, max_model_len)
    except features.FeatureAbsent as exc:
        raise ConfigRejected(f"cannot run: {exc}") from None
    return startup_budget(checked_config(e, max_model_len, False), kv_cache_config.kv_cache_groups, max_model_len)[0]


def at_max_model_len(vc: VllmConfig, max_model_len: int) -> VllmConfig:
    """`vc` with its own ModelConfig at `max_model_len`: the bridge's configs share one (built once,
    max_model_len 16384), and vLLM's scheduler, KV-cache manager and start-up check read the length."""
    if vc.model_config.max_model_len == max_model_len:
        return vc
    sized = copy.copy(vc)
    sized.model_config = copy.copy(vc.model_config)
    sized.model_config.max_model_len = max_model_len
    return sized


def startup_budget(vc: VllmConfig, groups: typing.Sequence[KVCacheGroupSpec], max_model_len: int
                   ) -> tuple[int, tuple[int, ...]]:
    """What vLLM's start-up check promises for `groups`: the smallest pool it starts with
    (`startup_min_blocks`), and the blocks it reserves in each group for one request of
    `max_model_len` tokens, the capacity a request alone may hold. The engine's check
    (`get_kv_cache_configs`, v1/core/kv_cache_utils.py:2628-2646 in 0.32) charges each group whole
    blocks, cdiv(its spec's `max_memory_usage_bytes`, its page size) (attention: a block per
    `block_size` tokens; mamba in align mode: 2 + speculative + checkpoint blocks), each block at the
    pool's bytes per block (one page of every layer of the largest group, so a group padded to that
    span pays for its padding: `_max_memory_usage_bytes_from_groups`, :2337-2366), and holds the null
    block back (:2628-2633). So the minimum is the groups' blocks plus one."""
    sized = at_max_model_len(vc, max_model_len)  # the check reads the engine's own
    reserves = tuple(-(-g.kv_cache_spec.max_memory_usage_bytes(sized) // g.kv_cache_spec.page_size_bytes)
                     for g in groups)
    return sum(reserves) + 1, reserves


# vLLM >= 0.32 hands a producer-side connector the exact blocks holding mamba "align" boundary states
