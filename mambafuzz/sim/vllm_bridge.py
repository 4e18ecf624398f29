"""The one module that drives vLLM's internals: config building, scheduler construction,
request creation, output feeding, and read-only views of the mamba block tables and the
prefix cache.  Its vLLM names come from `mambafuzz.sim.vllm_compat` (where each release keeps them);
config knobs a release lacks are dropped when left off, and refuse the input otherwise.
A vLLM upgrade starts in mambafuzz/sim/vllm_compat/symbols.py, then here.

Everything else in the project talks to `SchedulerSession`, never to vLLM objects.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import operator
import os
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
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
from mambafuzz.sim import architectures, patching  # noqa: E402
from mambafuzz.sim.vllm_compat import features, platform_gate  # noqa: E402
from mambafuzz.sim.vllm_compat.api import (  # noqa: E402
    CacheConfig,
    DraftTokenIds,
    FullAttentionSpec,
    KVCacheBlock,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVConnectorOutput,
    KVTransferConfig,
    MambaManager,
    MambaSpec,
    ModelConfig,
    ModelRunnerOutput,
    ParallelConfig,
    Request,
    RequestStatus,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    SpeculativeConfig,
    StructuredOutputManager,
    VllmConfig,
    get_kv_cache_groups_uniform_page_size,
    get_mamba_prefill_checkpoint_position,
    get_request_block_hasher,
    init_none_hash,
    is_mamba_prefill_checkpoint_valid,
    make_block_hash_with_group_id,
    platforms_module,
    resolve_kv_cache_block_sizes,
    sha256,
    triton_utils_module,
)
from mambafuzz.sim.vllm_compat.resolve import describe_vllm  # noqa: E402

for _name in ("vllm", "vllm.config", "vllm.v1"):
    logging.getLogger(_name).setLevel(logging.ERROR)

TINY_MODEL_DIR = Path(__file__).parent.parent / "tiny_model"
CONNECTOR_MODULE = "mambafuzz.sim.connector"
CONNECTOR_CLASS = "ScenarioConnector"
ATTN_LAYER = "model.layers.3.self_attn.attn"
MAMBA_LAYERS = [f"model.layers.{i}.linear_attn" for i in range(3)]
# The function the fuzzer swaps out; its signature is what `--split mod:fn` must match.
SPLIT_METHOD = "_mamba_block_aligned_split"
SplitFn = Callable[..., int]

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
    `connector`, the scenario's KV connector (mambafuzz.sim.connector) is configured as a consumer."""
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
            from mambafuzz.sim.vllm_compat.api import EagleModelTypes
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


def _checked_config(e: EngineConfig, max_model_len: int, connector: bool = True) -> VllmConfig:
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
    other than the tiny default gets its layers' specs from mambafuzz.sim.architectures."""
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


class CachedMambaEntry(typing.NamedTuple):
    """One prefix-cache key that points at a mamba block (a NamedTuple: built without a Python frame)."""

    block_hash: bytes
    block_id: int
    primary: bool  # the block's own key (block_hash_num_tokens describes it), not a secondary one
    claimed_tokens: int | None  # block_hash_num_tokens for a primary key


_BLOCK_ID = operator.attrgetter("block_id")
_NO_IDS: frozenset[str] = frozenset()

# The statuses vLLM counts as finished (`RequestStatus.is_finished`, asked once per status):
# `req.status in FINISHED_STATUSES` is `req.is_finished()` without its two Python calls, for hot loops.
FINISHED_STATUSES = frozenset(status for status in RequestStatus if RequestStatus.is_finished(status))


class SortedIds(set):
    """A worker's finished request ids that iterate in sorted order.  vLLM frees the blocks of
    `finished_sending` (and of finished requests in `finished_recving`) in the order it iterates
    the set (`Scheduler._update_from_kv_xfer_finished`), and a plain set of str iterates in the
    order of the process's hash seed: two processes would free, and then allocate, different
    block ids for the same input.  Any order is one a real worker may report; this one replays."""

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set.__iter__(self)))


class NoSchedulerOutput(Exception):
    """`schedule()` returned something that is not a SchedulerOutput: vLLM broke its contract with
    the engine core (the harness files it as a contract finding, SCHEDULE_RETURNS_OUTPUT)."""


class SchedulerSession:
    """One real vLLM Scheduler plus the handles the harness needs to drive and observe it."""

    def __init__(self, engine: EngineConfig, num_blocks: int, max_model_len: int, split: SplitFn | None,
                 connector: bool = True):
        """`connector`: configure the scenario's KV connector (a scenario whose requests claim
        external tokens); without it vLLM runs with no connector, as most deployments do."""
        vc = _checked_config(engine, max_model_len, connector)
        vc.cache_config.num_gpu_blocks = num_blocks
        # The scheduler and its KV-cache manager cap slots and rows at the model's max_model_len
        vc = at_max_model_len(vc, max_model_len)
        try:
            kv_cache_config = kv_cache_config_for(engine, num_blocks, max_model_len)
        except features.FeatureAbsent as exc:
            raise ConfigRejected(f"cannot run: {exc}") from None
        try:  # the engine core resolves both sizes this way before building its scheduler
            block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vc)
        except ValueError as exc:
            raise ConfigRejected(f"vLLM refuses this engine config: {str(exc).splitlines()[0]}") from None
        # vLLM's own choice of class for the mode (SchedulerConfig.get_scheduler_cls): AsyncScheduler
        # when async scheduling is on.
        scheduler_cls = vc.scheduler_config.get_scheduler_cls() if hasattr(vc.scheduler_config, "get_scheduler_cls") \
            else Scheduler
        self.scheduler = scheduler_cls(
            vllm_config=vc,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vc),
            block_size=block_size,
            hash_block_size=hash_block_size,
        )
        if split is not None:  # wrapped by any active fix of the split (mambafuzz.sim.patching)
            setattr(self.scheduler, SPLIT_METHOD, types.MethodType(patching.wrap_split(split), self.scheduler))
        self.kv_cache_groups = tuple(kv_cache_config.kv_cache_groups)
        self.model_description = architectures.describe(engine.model, self.kv_cache_groups, engine.num_speculative_tokens
                                                        if engine.uses_spec_decode else 0)
        self.runner = engine.runner or default_runner(vc)
        # The scheduler reads the flag at start-up; it changes only how SchedulerOutput hands
        # resumed requests to the worker (as new requests under V2), not what is scheduled.
        if RUNNER_CHOICE:  # 0.34's Scheduler has no such flag: it always hands requests over as for V2
            self.scheduler.use_v2_model_runner = runners.get(self.runner).use_v2_model_runner
        self.async_scheduling = bool(vc.scheduler_config.async_scheduling)
        self.batch_queue_depth = batch_queue_depth(vc, self.runner)
        self.hash_block_size = hash_block_size
        self.mamba_block_size = engine.mamba_block_size
        managers = self.scheduler.kv_cache_manager.coordinator.single_type_managers
        # Every mamba KV-cache group (vLLM's grouping gives an architecture several); the first is the one the
        # cache audit and the trace follow, the kernel model mirrors them all (mamba_tables).
        self.mamba_groups = tuple(i for i, m in enumerate(managers) if isinstance(m, MambaManager))
        self.mamba_group = self.mamba_groups[0]
        self._mamba_manager = managers[self.mamba_group]
        self._mamba_managers = tuple(managers[i] for i in self.mamba_groups)
        # The block grid a prefill checkpoint aligns to (vLLM >= 0.29 names it; before, the scheduler block).
        self.cache_hit_alignment_tokens: int = getattr(self._mamba_manager, "cache_hit_alignment_tokens", block_size)
        self.block_pool = self.scheduler.kv_cache_manager.block_pool
        self.null_block_id = self.block_pool.null_block.block_id
        self.allocated_blocks: set[int] = set()  # ever handed out by the pool
        self.reused_blocks: set[int] = set()  # handed out more than once: no longer the cache's initial zeros
        # [cached blocks the pool evicted to hand them out (LRU eviction in get_new_blocks)]; None on a
        # vLLM whose free queue or pool keeps none of what they are counted by
        queue = getattr(self.block_pool, "free_block_queue", None)
        self.lru_evictions: list[int] | None = [0] if (
            hasattr(queue, "fake_free_list_head") and hasattr(self.block_pool, "cached_block_hashes_by_block")) else None
        self._watch_reuse()
        self.over_estimates: list[tuple[str, int, int]] = []  # (request, blocks estimated, blocks taken)
        self._watch_estimates()
        self.startup_min_blocks, self.group_reserves = startup_budget(vc, kv_cache_config.kv_cache_groups, max_model_len)
        self.group_kinds = tuple("mamba" if isinstance(m, MambaManager) else type(m.kv_cache_spec).__name__
                                 for m in managers)
        self.group_block_sizes = tuple(m.block_size for m in managers)
        self._managers = tuple(managers)
        self._mamba_key_suffix = bytes(make_block_hash_with_group_id(b"", self.mamba_group))
        self.connector = self.scheduler.connector
        self._block_hasher = get_request_block_hasher(hash_block_size, sha256)
        self._watched_keys: object = None  # the key map cache_keys_version watches
        self._key_changes = [0]
        # the mamba blocks keyed in the prefix cache since the list was last cleared (once the watch is on):
        # `take_inserted` hands them out; a caller on a hot path may read and clear the list itself
        self.inserted_blocks: list[int] = []
        # [the (key, block) pairs of mamba keys new to the map since the last take_added_mamba_keys(), or
        # None when the map changed some other way since (a pop, a second block on a key) or is not watched]
        self._added: list = [None]
        # Our own references: vLLM drops finished requests from `scheduler.requests` inside
        # update_from_output, before their last sampled token could be read back.
        self._requests: dict[str, Request] = {}

    def _watch_reuse(self) -> None:
        """Record every block the pool hands out a second time. The worker allocates the whole
        KV cache zeroed (v1/worker/utils.py `allocate_kv_cache`: torch.zeros) and all groups
        share it, so a block on its first owner holds zeros until written; a block any group
        used before holds that group's bytes (mamba blocks are never zeroed on reuse)."""
        pool_get = self.block_pool.get_new_blocks
        ever, reused = self.allocated_blocks, self.reused_blocks
        # get_new_blocks hands out the first blocks of the free queue and evicts each that is cached
        # (`_maybe_evict_cached_block`: a primary `block_hash`, or secondary keys in
        # `cached_block_hashes_by_block`); they are counted before it does
        pool, evictions = self.block_pool, self.lru_evictions

        def get_new_blocks(num_blocks: int) -> list[KVCacheBlock]:
            if evictions is not None and pool.enable_caching:
                secondary = pool.cached_block_hashes_by_block
                block = pool.free_block_queue.fake_free_list_head.next_free_block
                for _ in range(min(num_blocks, pool.get_num_free_blocks())):
                    if block is None:
                        break
                    if block.block_hash is not None or block.block_id in secondary:
                        evictions[0] += 1
                    block = block.next_free_block
            blocks = pool_get(num_blocks)
            for b in blocks:
                if b.block_id in ever:
                    reused.add(b.block_id)
                else:
                    ever.add(b.block_id)
            return blocks

        self.block_pool.get_new_blocks = get_new_blocks

    def _watch_estimates(self) -> None:
        """Record every allocation that takes more blocks than vLLM checked for. `allocate_slots`
        (v1/core/kv_cache_manager.py:561-600 in 0.32) frees skipped blocks, asks the coordinator how
        many blocks the request needs, refuses when fewer are free, and only then takes them; nothing
        frees in between. So the blocks it takes (the free count at the estimate less the free count
        after) are at most the estimate (over-estimating is by design, single_type_kv_cache_manager.py:
        1722-1723). One taken past it is a block the admission check never saw: on a pool tight
        enough, `get_new_blocks` raises inside schedule()."""
        manager, coordinator, pool = self.scheduler.kv_cache_manager, self.scheduler.kv_cache_manager.coordinator, \
            self.block_pool
        allocate, estimate = manager.allocate_slots, coordinator.get_num_blocks_to_allocate
        seen: list = [None]  # (estimate, free count then) of the allocate_slots call in progress
        over = self.over_estimates

        def counted_estimate(*args, **kwargs):
            n = estimate(*args, **kwargs)
            if seen[0] is not None and not kwargs.get("apply_admission_cap", False):
                seen[0] = (n, pool.get_num_free_blocks())
            return n

        def checked_allocate(request, *args, **kwargs):
            seen[0] = ()
            try:
                blocks = allocate(request, *args, **kwargs)
                if blocks is not None and seen[0]:
                    n, free = seen[0]
                    taken = free - pool.get_num_free_blocks()
                    if taken > n:
                        over.append((request.request_id, n, taken))
                return blocks
            finally:
                seen[0] = None

        coordinator.get_num_blocks_to_allocate = counted_estimate
        manager.allocate_slots = checked_allocate

    # ---- driving ----------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: list[int], max_tokens: int, arrival: float) -> None:
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt),
            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0),
            pooling_params=None,
            arrival_time=arrival,
            block_hasher=self._block_hasher,
        )
        self._requests[request_id] = request
        self.scheduler.add_request(request)

    def abort(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def schedule(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        if not isinstance(out, SchedulerOutput):  # the worker could not even start on it
            raise NoSchedulerOutput(f"Scheduler.schedule() returned {type(out).__name__}, not a SchedulerOutput")
        return out

    def feed(self, out: SchedulerOutput, sampled: dict[str, list[int]], finished_recving: set[str],
             failed_recving: set[str] | None = None, finished_sending: set[str] | None = None) -> None:
        """update_from_output with the batch's tokens and what the worker's KV connector finished:
        loads (`finished_recving`; a failed one is in `failed_recving` as well) and sends."""
        req_ids = list(out.num_scheduled_tokens)
        connector_output = None
        if finished_recving or finished_sending:
            connector_output = KVConnectorOutput(finished_recving=SortedIds(finished_recving) or None)
            if failed_recving:
                connector_output.failed_recving = SortedIds(failed_recving)
            if finished_sending:
                connector_output.finished_sending = SortedIds(finished_sending)
        self.scheduler.update_from_output(
            out,
            ModelRunnerOutput(
                req_ids=req_ids,
                sampled_token_ids=[sampled.get(r, []) for r in req_ids],
                kv_connector_output=connector_output,
                # 0.34 dropped the field and indexes by position in req_ids (scheduler.py:2356-2358).
                **({"req_id_to_index": {r: i for i, r in enumerate(req_ids)}} if ROW_INDEX_FIELD else {}),
            ),
        )

    def set_drafts(self, drafts: dict[str, list[int]]) -> None:
        if drafts:
            ids = list(drafts)
            self.scheduler.update_draft_token_ids(DraftTokenIds(ids, [drafts[r] for r in ids]))

    # ---- observing --------------------------------------------------------------------
    def request(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def has_requests(self) -> bool:
        """What the engine core asks before scheduling: unfinished requests, or finished ones whose
        ids the next SchedulerOutput still has to hand the worker."""
        return self.scheduler.has_requests()

    def mamba_block_ids(self, request_id: str) -> list[int]:
        return list(map(_BLOCK_ID, self._mamba_manager.req_to_blocks.get(request_id, ())))

    def mamba_blocks(self, request_id: str) -> Sequence[KVCacheBlock]:
        """The request's block list in the first mamba group, vLLM's own (read it, never change it)."""
        return self._mamba_manager.req_to_blocks.get(request_id, ())

    def mamba_block_lists(self, request_id: str) -> tuple[Sequence[KVCacheBlock], ...]:
        """`mamba_blocks` in every mamba group, in group order: vLLM's own lists, read per scheduled row
        without copying (`mamba_tables` builds the ids)."""
        return tuple([m.req_to_blocks.get(request_id, ()) for m in self._mamba_managers])

    def mamba_tables(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table in every mamba group, in group order (the first is `mamba_block_ids`).
        Built per scheduled row, so without a comprehension's frame per group."""
        managers = self._mamba_managers
        if len(managers) == 3:  # the tiny model's three groups, unrolled: the same lists without the loop
            a, b, c = managers
            return ([*map(_BLOCK_ID, a.req_to_blocks.get(request_id, ()))],
                    [*map(_BLOCK_ID, b.req_to_blocks.get(request_id, ()))],
                    [*map(_BLOCK_ID, c.req_to_blocks.get(request_id, ()))])
        tables = []
        for m in managers:
            tables.append([*map(_BLOCK_ID, m.req_to_blocks.get(request_id, ()))])
        return tuple(tables)

    def cache_keys_version(self) -> int:
        """A number that changes whenever a key of the mamba group is added to or removed from
        the prefix cache: the per-step cache audit rescans `cached_mamba_blocks` only when it
        moved. The watch is installed on the first call (wrapping the key map's `insert` and
        `pop`, the only ways vLLM changes it), and again should vLLM replace the map."""
        keys = self.block_pool.cached_block_hash_to_block
        if keys is not self._watched_keys:
            changes, suffix, inserted, added = self._key_changes, self._mamba_key_suffix, self.inserted_blocks, self._added
            insert, pop = keys.insert, keys.pop
            # Where a key maps to its block itself (vLLM before 0.34: no `_dup_ids`), a key new to the map is
            # yielded last by `cached_mamba_blocks`, as the block it was inserted with: `take_added_mamba_keys`
            # hands those out. Any other layout, and any other change, leaves it None.
            cache = None if hasattr(keys, "_dup_ids") else getattr(keys, "_cache", None)

            def counted_insert(key, *args, **kwargs):
                if key[-4:] == suffix:
                    changes[0] += 1
                    block = args[0] if args else kwargs.get("block")
                    if block is not None:
                        inserted.append(block.block_id)
                    pairs = added[0]
                    if pairs is not None:
                        if block is None or type(cache) is not dict or key in cache:
                            added[0] = None  # a second block on a key keeps the key's place in the map
                        else:
                            pairs.append((key, block))
                return insert(key, *args, **kwargs)

            def counted_pop(key, *args, **kwargs):
                if key[-4:] == suffix:
                    changes[0] += 1
                    added[0] = None  # a key put back after a pop moves to the map's end
                return pop(key, *args, **kwargs)

            keys.insert, keys.pop = counted_insert, counted_pop
            self._watched_keys = keys
            # a new map: nothing is known of it until a full scan, unless it is empty (the harness installs
            # the watch before the first schedule()): then a scan would yield nothing, and the added pairs next
            added[0] = [] if type(cache) is dict and not cache else None
            changes[0] += 1
        return self._key_changes[0]

    def take_added_mamba_keys(self) -> list[tuple[bytes, KVCacheBlock]] | None:
        """The (key, block) pairs of the mamba keys added to the prefix cache since the last call, in
        order, when nothing else changed the mamba keys since (no pop, no second block on a key): then
        `cached_mamba_blocks` yields what it yielded at that call followed by these pairs. (Before the
        first call, "that call" is the watch's install on an empty map, which yielded nothing.) None when
        a full scan is needed (always before the watch is on, after it was installed on a map holding
        keys, or on a vLLM whose key map keeps block ids)."""
        added = self._added
        pairs = added[0]
        added[0] = [] if self._watched_keys is not None else None
        return pairs

    def take_inserted(self) -> tuple[int, ...]:
        """The mamba blocks keyed in the prefix cache since the last call (once the watch is on)."""
        inserted = self.inserted_blocks
        if not inserted:
            return ()
        out = tuple(inserted)
        inserted.clear()
        return out

    def cached_mamba_blocks(self) -> Iterator[tuple[bytes, KVCacheBlock]]:
        """(key, block) for every live prefix-cache key of the mamba group: the raw form, so the
        per-step audit can skip the entries it has already judged without building anything."""
        suffix = self._mamba_key_suffix
        keys = self.block_pool.cached_block_hash_to_block
        # vLLM 0.34 keeps block ids, not blocks: one id per key in `_cache`, and every id of a key
        # several blocks share in `_dup_ids` (v1/core/block_pool.py:52-64). Before, a block or a dict of them.
        dup_ids = getattr(keys, "_dup_ids", None)
        blocks = self.block_pool.blocks
        for key, value in keys._cache.items():
            if key[-4:] != suffix:  # the group id is the key's last 4 bytes (make_block_hash_with_group_id)
                continue
            if dup_ids is not None:
                for block_id in dup_ids.get(key, (value,)):
                    yield key, blocks[block_id]
            elif isinstance(value, dict):
                for block in value.values():
                    yield key, block
            else:
                yield key, value

    def walk_pool(self) -> tuple[tuple[int, int, int], tuple[int, int, int, int] | None]:
        """The pool's own accounting, for the resource oracles, in one pass over its blocks.

        First (the free count it reports, blocks other than the null block with no reference, blocks
        with a negative reference count). The free queue holds exactly the unreferenced blocks
        (BlockPool.free_blocks appends a block when its count reaches 0, `touch` and get_new_blocks
        take it out), so the first two are equal. The null block's count means nothing (free_blocks
        decrements it like any block, `touch` skips nothing for it, and the pool never frees it), so
        it is left out throughout.

        Second, the first block (by id) whose reference count is not the number of places that hold
        it: its entries in every request's table, in every KV-cache group, plus its entries in the
        scheduler's deferred frees (`Scheduler.deferred_frees`, blocks of a freed request or a
        copy-on-write retention an in-flight step may still write), as (block id, its count, table
        entries, deferred entries); None when every count is its holders'. vLLM 0.32 keeps them
        equal: a block is touched or handed out exactly as it joins a table
        (single_type_kv_cache_manager.py:303-310, 364-365, 405-406), released exactly as it leaves
        one or a deferred free drains (562-589, 1592-1641; sched/scheduler.py:2766-2801), and a
        copy-on-write retention is released or deferred before schedule() returns (1474-1482)."""
        pool = self.block_pool
        blocks = pool.blocks
        holders = [0] * len(blocks)  # by block id (the pool's list is in id order)
        for m in self._managers:
            for table in m.req_to_blocks.values():
                for block in table:
                    holders[block.block_id] += 1
        deferred_frees = getattr(self.scheduler, "deferred_frees", ())
        for _, deferred in deferred_frees:
            for block in deferred:
                holders[block.block_id] += 1
        null = self.null_block_id
        # The counts read in one comprehension, then judged by C-level list operations (equality,
        # count, min): the walk's one Python-level loop is the read itself
        counts = [block.ref_cnt for block in blocks]
        holders[null] = counts[null]  # the null block is left out: its own count is taken as right
        mismatch = None
        if counts != holders:
            i = next(i for i, (count, expected) in enumerate(zip(counts, holders)) if count != expected)
            deferred = sum(b.block_id == i for _, d in deferred_frees for b in d)
            mismatch = i, counts[i], holders[i] - deferred, deferred
        unreferenced = counts.count(0) - (counts[null] == 0)  # the null block left out of both counts
        negative = sum(c < 0 for c in counts) - (counts[null] < 0) if min(counts) < 0 else 0
        return (pool.get_num_free_blocks(), unreferenced, negative), mismatch

    def num_free_blocks(self) -> int:
        """The pool's free count, as vLLM reports it."""
        return self.block_pool.get_num_free_blocks()

    def block_holders(self) -> list[str]:
        """The requests holding blocks in any KV-cache group (a table that is not empty), sorted."""
        holders: set[str] = set()
        for m in self._managers:
            for rid, blocks in m.req_to_blocks.items():
                if blocks:
                    holders.add(rid)
        return sorted(holders)

    def sole_holder(self) -> str | None:
        """The one request holding blocks, when exactly one does (the capacity rule's case); stops
        at the second holder it meets, so a busy step costs a few lookups."""
        sole = None
        for m in self._managers:
            for rid, blocks in m.req_to_blocks.items():
                if blocks and rid != sole:
                    if sole is not None:
                        return None
                    sole = rid
        return sole

    def held_blocks(self, request_id: str) -> tuple[int, ...]:
        """The blocks `request_id` holds in each KV-cache group, the null block not counted (align
        mode nulls the state blocks it no longer needs: `remove_skipped_blocks`)."""
        held = []
        for m in self._managers:  # run after each step the request holds blocks alone: plain loops (see walk_pool)
            blocks = m.req_to_blocks.get(request_id, ())
            count = len(blocks)
            for block in blocks:
                if block.is_null:
                    count -= 1
            held.append(count)
        return tuple(held)

    def own_scratch(self, request_id: str, block_id: int) -> bool:
        """Whether `block_id` is a block `request_id` alone holds, unhashed, in its mamba tables: one a
        stale write of its own cannot harm anyone (BlockPool.is_block_writable, the condition
        MambaManager._relocate_speculative_block asserts before it moves a block to a later column)."""
        block = self.block_pool.blocks[block_id]
        if not self.block_pool.is_block_writable(block):
            return False
        return any(block in m.req_to_blocks.get(request_id, ()) for m in self._mamba_managers)

    @staticmethod
    def mamba_entry(key: bytes, block: KVCacheBlock) -> CachedMambaEntry:
        """One (key, block) pair of `cached_mamba_blocks`, described."""
        primary = block.block_hash == key
        # the key less its group id, its last 4 bytes (get_block_hash, as `cached_mamba_blocks` reads it)
        return tuple.__new__(CachedMambaEntry, (bytes(key[:-4]), block.block_id, primary,
                                                block.block_hash_num_tokens if primary else None))

    @staticmethod
    def spec_tokens(out: SchedulerOutput) -> Mapping[str, list[int]]:
        return out.scheduled_spec_decode_tokens

    @staticmethod
    def preempted(out: SchedulerOutput) -> AbstractSet[str]:
        """The requests `out` preempted; read-only (most steps preempt none: one shared empty set)."""
        ids = out.preempted_req_ids
        return set(ids) if ids else _NO_IDS


def startup_min_blocks(e: EngineConfig, max_model_len: int) -> int:
    """The smallest pool vLLM starts an engine with for this config: its start-up check wants, per
    KV-cache group, the blocks of one request of `max_model_len` tokens at its largest (`startup_budget`),
    beside the null block the pool holds back."""
    try:
        kv_cache_config = kv_cache_config_for(e, 1, max_model_len)
    except features.FeatureAbsent as exc:
        raise ConfigRejected(f"cannot run: {exc}") from None
    return startup_budget(_checked_config(e, max_model_len, False), kv_cache_config.kv_cache_groups, max_model_len)[0]


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
# (SchedulerOutput.kv_connector_block_state, v1/core/sched/output.py:215-228); before, no such field.
BOUNDARY_STATE_OFFLOADS = "kv_connector_block_state" in features.init_params(SchedulerOutput)
NO_BOUNDARY_STATE_OFFLOADS = (f"{VLLM} has no SchedulerOutput.kv_connector_block_state: it names no mamba block "
                              "for a connector to save, so the simulated connector saves nothing")


def boundary_state_offloads(out: SchedulerOutput) -> list[tuple[str, int, int, int]] | None:
    """This schedule's boundary-state hand-offs, (request, KV-cache group, block id, boundary tokens)
    in the scheduler's order; None on a vLLM without them. Read in the connector's
    `build_connector_meta`: the scheduler clears the field right after (scheduler.py:1547)."""
    if not BOUNDARY_STATE_OFFLOADS:
        return None
    state = out.kv_connector_block_state
    if state is None:
        return []
    return [(rid, group, block, tokens) for rid, entries in state.boundary_state_offloads.items()
            for group, block, tokens in entries]


def is_waiting_for_remote_kv(req: Request) -> bool:
    return req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
