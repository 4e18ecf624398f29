"""The input model: what one fuzz case is, as plain dataclasses with a versioned JSON form.

A scenario names an engine config and a mix of requests.  Prompts are built from shared
prefix segments plus a unique tail, so that prefix-cache hits happen naturally; token ids
are derived from `token_seed`, so a scenario file stays small and readable.

Everything downstream (decoder, strategies, minimizer, harness) speaks this model only.
It stays one module of more than 600 lines on purpose: a knob's declaration, its JSON form and
its validation rule are read and changed together, and every layer imports them from here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from mambafuzz.model.architectures import DEFAULT_MODEL, MODELS
from mambafuzz.model.architectures import get as get_architecture
from mambafuzz.model.runners import RUNNERS

FORMAT_NAME = "mambafuzz-scenario"
FORMAT_VERSION = 2
# Version 1 predates `engine.async_scheduling`: every version-1 file was found and recorded under
# vLLM's synchronous Scheduler, so it loads with the knob false (never with vLLM's async default).
READABLE_VERSIONS = (1, 2)

# Token ids live in [1, VOCAB_SIZE); the tiny model config ships a vocab this large.
VOCAB_SIZE = 1024

SPEC_METHODS = ("none", "mtp")
CONNECTOR_LOAD_SOURCES = ("truth", "saved")
SCHEDULING_POLICIES = ("fcfs", "priority")  # vLLM's SchedulerConfig.policy
MAX_PRIORITY = 8  # RequestSpec.priority is drawn and validated in [0, MAX_PRIORITY]
MAX_CONNECTOR_DEFER = 8  # RequestSpec.connector_defer is validated in [0, MAX_CONNECTOR_DEFER]
# How the connector's worker reports a failed load (EngineConfig.connector_failure_report).
FAILURE_REPORTS = ("failed_recving", "invalid_block_ids")

# Hard ceilings that keep one scenario cheap; the decoder and validation share them.
MAX_REQUESTS = 16
MAX_PROMPT_TOKENS = 8192
MAX_OUTPUT_TOKENS = 256
MAX_STEPS_ARRIVAL = 64
MAX_POOL_BLOCKS = 4096


class ScenarioError(ValueError):
    """A scenario file or object that cannot be run; `problems` holds one line per issue."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


KEEP = object()  # Knob.uncached: the field keeps its value when prefix caching is off


@dataclass(frozen=True)
class Knob:
    """What the rest of the tool needs to know about one engine-config field, declared once.

    Validation (`validate`), the generator (`mambafuzz.model.generate`, for knobs it has no hand-made
    distribution for), the minimizer's passes, the config cache key (`mambafuzz.sim.bridge.configs`) and
    the prefix-caching-off twin (`EngineConfig.without_prefix_caching`) are all derived from it,
    so adding a knob is one field here plus tests."""

    kind: str  # "int", "bool" or "choice"
    lo: int = 0
    hi: int | None = None
    optional: bool = False  # None is allowed (vLLM's default / not set)
    choices: Collection[str] = ()  # a live registry (the runners) is read at each check
    simplest: Any = None  # what the minimizer tries first; None for an optional knob means "unset"
    shrink: bool = True  # the minimizer may move it towards `simplest` (False: a pass of its own does)
    companions: tuple[tuple[str, Any], ...] = ()  # fields set with it when it takes its simplest value
    build_key: bool = True  # part of the VllmConfig this config builds (the config cache key)
    uncached: Any = KEEP  # its value in the twin run with prefix caching off
    generate: bool = True  # drawn generically when mambafuzz.model.generate has no distribution of its own
    # A token length or position (a block size, a budget, an alignment): the geometry pass
    # (mambafuzz.model.geometry) scales it with the mamba block; counts of steps, requests or drafts are not
    length: bool = False


def knob(default: Any, **spec: Any) -> Any:
    """A dataclass field carrying its Knob."""
    return field(default=default, metadata={"knob": Knob(**spec)})


@functools.cache
def knobs() -> dict[str, Knob]:
    """Every EngineConfig field's Knob, in field order."""
    return {f.name: f.metadata["knob"] for f in dataclasses.fields(EngineConfig)}


@dataclass
class EngineConfig:
    """The vLLM knobs that change how align-mode chunks are cut and states cached."""

    mamba_block_size: int = knob(256, kind="int", lo=8, hi=1 << 16, shrink=False, length=True)
    attn_block_size: int = knob(16, kind="int", lo=1, hi=1 << 12, shrink=False, length=True)
    # None: vLLM default (gcd of the group block sizes)
    prefix_match_unit: int | None = knob(None, kind="int", lo=1, hi=1 << 16, optional=True, uncached=None,
                                          length=True)
    max_num_batched_tokens: int = knob(512, kind="int", lo=1, hi=1 << 16, simplest=1, length=True)
    long_prefill_token_threshold: int = knob(0, kind="int", lo=0, hi=1 << 16, simplest=0, length=True)
    max_num_seqs: int = knob(8, kind="int", lo=1, hi=256, simplest=1)
    # None: sized so nothing is ever preempted; else at least vLLM's start-up minimum (min_pool_blocks)
    num_gpu_blocks: int | None = knob(None, kind="int", lo=1, hi=MAX_POOL_BLOCKS, optional=True, build_key=False)
    spec_method: str = knob("none", kind="choice", choices=SPEC_METHODS, simplest="none",
                            companions=(("num_speculative_tokens", 0),))
    num_speculative_tokens: int = knob(0, kind="int", lo=0, hi=8, simplest=0, companions=(("spec_method", "none"),))
    # without checkpoint blocks the alignment is read by nothing (vLLM gates it on the blocks, and no
    # layer declares one without the other: MambaMixer2.get_kv_cache_spec), so shrinking clears it
    num_prefill_checkpoint_blocks: int = knob(0, kind="int", lo=0, hi=4, simplest=0, build_key=False, uncached=0,
                                              companions=(("prefill_checkpoint_alignment", None),))
    prefill_checkpoint_alignment: int | None = knob(None, kind="int", lo=1, hi=1 << 16, optional=True,
                                                    companions=(("num_prefill_checkpoint_blocks", 0),),
                                                    build_key=False, uncached=None, length=True)
    enable_mamba_shared_prefix_checkpoint: bool = knob(False, kind="bool", simplest=False, uncached=False)
    prefix_cache_retention_interval: int | None = knob(0, kind="int", lo=0, hi=1 << 20, optional=True, simplest=0,
                                                        length=True)
    enable_prefix_caching: bool = knob(True, kind="bool", simplest=True, uncached=False, generate=False)
    # a registered runner (mambafuzz.model.runners); None: what vLLM picks on a CUDA host (configs.default_runner).  Not drawn:
    # the campaign's --runner (or vLLM's default) decides it.
    runner: str | None = knob(None, kind="choice", choices=RUNNERS, optional=True, simplest=None, build_key=False,
                              generate=False)
    # The scheduler class and how the engine core drives it. True: vLLM's AsyncScheduler with a batch
    # queue (EngineCore.step_with_batch_queue); False: Scheduler, one batch at a time (EngineCore.step);
    # None: what vLLM picks for this config on a CUDA host (configs.default_async_scheduling), async
    # in 0.32 for every config here. The minimizer moves it to vLLM's default: a case that still fails
    # there is one every default deployment can hit.
    async_scheduling: bool | None = knob(None, kind="bool", optional=True, simplest=None)
    # Pipeline-parallel stages. vLLM keeps `max_concurrent_batches` = stages + 1 batches in flight on
    # Model Runner V2 under async scheduling (config/vllm.py), and its AsyncScheduler lets a request
    # decode once every `stages` steps (async_scheduler.py `decode_stagger`, `next_decode_eligible_step`).
    # Modelled only there: vLLM turns async off for V1 with stages > 1, and the synchronous scheduler
    # under a batch queue is not modelled. Drawn by mambafuzz.model.generate after the scheduling mode.
    pipeline_parallel_size: int = knob(1, kind="int", lo=1, hi=4, simplest=1, generate=False)
    # The hybrid architecture whose KV-cache groups the engine is built with (mambafuzz/model/architectures.py;
    # specs in mambafuzz/sim/bridge/architectures.py). The default is the tiny qwen3_next every scenario ran before
    # the knob; it is left out of a scenario file's JSON, so old files round-trip unchanged. Drawn last
    # by the generator (draw_scenario), moved to the default by the minimizer.
    model: str = knob(DEFAULT_MODEL, kind="choice", choices=MODELS, simplest=DEFAULT_MODEL, generate=False)
    # Tokens between the longest request's last token and `max_model_len` (a deployment's
    # --max-model-len). None: k+1 (every draft of the last step fits, as before the knob). Smaller,
    # the scheduler cuts a request's drafts near the end (Scheduler.schedule caps a row at
    # max_model_len - num_computed_tokens - num_sampled_tokens_per_step), so a decode that accepted
    # drafts can be followed by one with none. Left out of the JSON when None; drawn by the conform
    # target's pass (mambafuzz.model.generate.draw_worker_rows).
    max_model_len_slack: int | None = knob(None, kind="int", lo=0, hi=8, optional=True, simplest=None,
                                           build_key=False, generate=False)
    # cache_config.block_size as vLLM 0.32's EngineCore leaves it: False, the mamba block (what the
    # model's own layers give, Platform._align_hybrid_block_size ties them); True, the smallest
    # block of the prefix-cacheable KV-cache groups (EngineCore._initialize_kv_caches, core.py:341-356),
    # so the attention group stands for a finer group of its own (vLLM's comment in
    # mamba_hybrid.py:118-120 names a DFlash drafter's). The scheduler's align split and V2's
    # worker read this field; mamba blocks keep `mamba_block_size`. Left out of the JSON when False;
    # drawn by the conform target's pass (mambafuzz.model.generate.draw_worker_rows).
    block_size_from_groups: bool = knob(False, kind="bool", simplest=False, generate=False)
    # SchedulerConfig.policy: "fcfs" (vLLM's default) or "priority". Under "priority" the waiting
    # queue is a heap by (RequestSpec.priority, arrival) and a running request that cannot get its
    # blocks preempts the running request with the largest (priority, arrival_time), which may be one
    # schedule() has already given blocks to this step (scheduler.py:795-833); under "fcfs" it is the
    # last running one. Left out of the JSON when "fcfs"; drawn by mambafuzz.model.generate after
    # every other draw, so the inputs drawn before the knob keep their values.
    scheduling_policy: str = knob("fcfs", kind="choice", choices=SCHEDULING_POLICIES, simplest="fcfs",
                                  generate=False)
    # The scenario's KV connector (mambafuzz/sim/engine/connector.py), playing the scheduler side of a
    # saving and loading connector (LMCache, NIXL). Off, it only loads, the true state, within one
    # step: what every file before these knobs ran. None is drawn by the generic generator (a draw
    # would change every generated input's stream); they are not part of the VllmConfig.
    # Save the mamba blocks the scheduler hands off (`boundary_state_offloads`), as copied after the
    # step's forward; on `request_finished` return delay_free=True: the blocks are freed, and the saved
    # entries stored, when the worker reports `finished_sending`, `connector_send_steps` engine steps
    # (update_from_output calls) later.
    connector_save: bool = knob(False, kind="bool", simplest=False, build_key=False, uncached=False, generate=False)
    connector_send_steps: int = knob(0, kind="int", lo=0, hi=8, simplest=0, build_key=False, uncached=0, generate=False)
    # What a load delivers: "truth" (the state of the request's own tokens: a store that never errs) or
    # "saved" (what an earlier request saved under the block hash; a hit only where a save exists).
    connector_load_source: str = knob("truth", kind="choice", choices=CONNECTOR_LOAD_SOURCES, simplest="truth",
                                      build_key=False, uncached="truth", generate=False)
    # An async load completes (`finished_recving`) this many forwards after the one that started it.
    connector_recv_steps: int = knob(0, kind="int", lo=0, hi=8, simplest=0, build_key=False, uncached=0, generate=False)
    # The n-th async load (1-based, in the order vLLM asked for them) fails: the worker reports the
    # request in `failed_recving`; 0: none fails.
    connector_failed_load: int = knob(0, kind="int", lo=0, hi=MAX_REQUESTS, simplest=0, build_key=False, uncached=0,
                                      generate=False)
    # KVTransferConfig.kv_load_failure_policy: "fail" (vLLM's default: the request finishes with an
    # error) or "recompute" (Scheduler._handle_failed_recving resets it to recompute). A VllmConfig field.
    connector_failure_policy: str = knob("fail", kind="choice", choices=("fail", "recompute"), simplest="fail",
                                         generate=False)
    # KVConnectorBase_V1.supports_divergent_local_hybrid_hits (NIXL declares it).
    connector_divergent_hits: bool = knob(False, kind="bool", simplest=False, build_key=False, uncached=False,
                                          generate=False)
    # The n-th synchronous load (1-based, in the order vLLM asked for them) fails: the worker writes nothing
    # into its blocks and reports the request as `connector_failure_report` says, in the output of the
    # batch that scheduled it; 0: none fails. Left out of the JSON when 0.
    connector_failed_sync_load: int = knob(0, kind="int", lo=0, hi=MAX_REQUESTS, simplest=0, build_key=False,
                                           uncached=0, generate=False)
    # The channel a failed load is reported through: "failed_recving" (KVConnectorOutput.failed_recving, by
    # request) or "invalid_block_ids" (by block, `get_block_ids_with_load_errors`), which vLLM 0.32 refuses
    # on every layout with several KV-cache groups (validate). Left out of the JSON when "failed_recving".
    connector_failure_report: str = knob("failed_recving", kind="choice", choices=FAILURE_REPORTS,
                                         simplest="failed_recving", build_key=False, generate=False)

    def without_prefix_caching(self) -> EngineConfig:
        """The same engine with prefix caching off: the differential's twin."""
        changes = {name: k.uncached for name, k in knobs().items() if k.uncached is not KEEP}
        return dataclasses.replace(self, **changes)

    @property
    def hash_block_size(self) -> int:
        """What vLLM resolves `prefix_match_unit` to (kv_cache_utils.resolve_kv_cache_block_sizes)."""
        return self.prefix_match_unit or math.gcd(self.attn_block_size, self.mamba_block_size)

    @property
    def uses_spec_decode(self) -> bool:
        return self.spec_method != "none" and self.num_speculative_tokens > 0

    @property
    def mixer(self) -> str:
        """The mixer family the config stands for: only Mamba2-style mixers declare internal
        prefill checkpoints (`MambaMixer2.get_kv_cache_spec`); GDN declares none."""
        if self.model != DEFAULT_MODEL and self.model in MODELS:
            return get_architecture(self.model).mixer  # the architecture's own mixer layers
        return "mamba2" if self.num_prefill_checkpoint_blocks else "gdn"


@dataclass
class RequestSpec:
    """One request: when it arrives, what its prompt is made of, and how it ends."""

    arrival_step: int = 0
    prefix_ids: list[int] = field(default_factory=list)  # indexes into Scenario.prefixes
    unique_len: int = field(default=1, metadata={"length": True})  # token lengths: scaled by the geometry pass
    max_tokens: int = 4
    external_tokens: int = field(default=0, metadata={"length": True})  # prompt tokens a KV connector claims to hold
    external_async: bool = False
    abort_step: int | None = None
    # Where the engine core takes the abort: False, from its input queue before the step's
    # schedule(); True, it arrived while a batch executed, so the aborts queue delivers it right
    # before the next update_from_output (EngineCore.step and step_with_batch_queue both drain it
    # there), or at the next step's input when that step applies no output.
    abort_in_flight: bool = False
    # A continuation (a later turn, or a retry): the index of an earlier request whose prompt plus
    # (a prefix of) its generated tokens start this prompt; `prefix_ids` and `unique_len` form the
    # new tail after them (`unique_len` may be 0). It arrives at the first step >= arrival_step at
    # which that request has finished or was aborted. None: an ordinary request.
    continues: int | None = None
    # How many of the earlier request's generated tokens to include (None: all it generated); a
    # request that generated fewer gives what it has.
    continue_outputs: int | None = None
    # vLLM's Request.priority: lower runs first under engine.scheduling_policy "priority" (the engine
    # ignores it under "fcfs"). Left out of the JSON when 0.
    priority: int = 0
    # The KV connector answers this request's lookup (`get_num_new_matched_tokens`) with (None, False),
    # "not known yet, ask again", in the first `connector_defer` schedule() calls that ask it; then it
    # answers as scripted. vLLM 0.32 skips the request for the rest of that schedule() and puts it back at
    # the head of the waiting queue (scheduler.py:986-990, 903-910, 1394-1395). A connector is attached for
    # it even when no request claims tokens. Left out of the JSON when 0.
    connector_defer: int = 0


# RequestSpec fields written to JSON only when set: files without them load and dump unchanged.
_OPTIONAL_REQUEST_FIELDS = ("continues", "continue_outputs")


@dataclass
class PrefixCacheReset:
    """One call of the engine's `reset_prefix_cache` (vLLM 0.32: `LLMEngine`/`AsyncLLM.reset_prefix_cache`
    -> `EngineCore.reset_prefix_cache`, core.py:871-876 -> `Scheduler.reset_prefix_cache`,
    scheduler.py:2840-2883), as a client's utility call the engine core takes from its input queue
    before `step`'s engine step (`_process_input_queue`, core.py:1573-1601), after that step's
    arrivals and aborts. `reset_running_requests`: preempt every running request first (their
    output still in flight is dropped), so the reset succeeds; without it the reset returns False
    while any block is in use (block_pool.py:837-844). `reset_connector` is not modelled."""

    step: int = 0
    reset_running_requests: bool = False


_RESET_FIELDS = {f.name: f for f in dataclasses.fields(PrefixCacheReset)}


@dataclass
class Scenario:
    engine: EngineConfig = field(default_factory=EngineConfig)
    prefixes: list[int] = field(default_factory=list)  # shared prefix segment lengths
    requests: list[RequestSpec] = field(default_factory=list)
    # Accepted draft tokens per engine step (cycled); empty means every draft is accepted.
    acceptance: list[int] = field(default_factory=list)
    token_seed: int = 0
    # Engine-level events: the steps at which a client calls `reset_prefix_cache` (PrefixCacheReset), in
    # step order, at most one a step. Left out of the JSON when empty.
    prefix_cache_resets: list[PrefixCacheReset] = field(default_factory=list)

    # ---- derived views -------------------------------------------------------------
    def request_ids(self) -> list[str]:
        return [f"r{i}" for i in range(len(self.requests))]

    def tail_tokens(self, index: int) -> list[int]:
        """Request `index`'s own tokens: its prefix segments, then a unique tail (its whole prompt
        unless it continues an earlier request)."""
        spec = self.requests[index]
        tokens: list[int] = []
        for prefix_id in spec.prefix_ids:
            tokens += _segment_tokens(self.token_seed, ("prefix", prefix_id), self.prefixes[prefix_id])
        tokens += _segment_tokens(self.token_seed, ("tail", index), spec.unique_len)
        return tokens

    def prompt_tokens(self, index: int) -> list[int]:
        """The prompt of request `index`: its prefix segments, then a unique tail. A continuation's
        prompt exists only in a run (`continuation_prompt`)."""
        spec = self.requests[index]
        if spec.continues is not None:
            raise ScenarioError([f"requests[{index}] continues r{spec.continues}: its prompt depends on what "
                                 f"r{spec.continues} generates in a run"])
        return self.tail_tokens(index)

    def continuation_prompt(self, index: int, earlier_tokens: Sequence[int], earlier_prompt_len: int) -> tuple[list[int], int]:
        """The prompt of continuation `index` in a run where the request it continues ended holding
        `earlier_tokens` (its prompt of `earlier_prompt_len` tokens, then what it generated), and
        how many generated tokens it takes."""
        spec = self.requests[index]
        generated = len(earlier_tokens) - earlier_prompt_len
        n = generated if spec.continue_outputs is None else min(spec.continue_outputs, generated)
        return list(earlier_tokens[:earlier_prompt_len + n]) + self.tail_tokens(index), n

    def static_prompts(self) -> list[list[int] | None]:
        """Every request's prompt, None for a continuation (built at its arrival: StepPlan.feed)."""
        return [None if r.continues is not None else self.tail_tokens(i) for i, r in enumerate(self.requests)]

    def prompt_key(self, index: int) -> tuple:
        """What `prompt_tokens(index)` depends on: equal keys, equal prompts (a cheap cache key)."""
        spec = self.requests[index]
        return (self.token_seed, tuple((p, self.prefixes[p]) for p in spec.prefix_ids), index, spec.unique_len)

    def prompt_len(self, index: int) -> int:
        """The prompt's length; for a continuation its longest (the earlier request generated all
        its max_tokens): what pool sizes, max_model_len and the prompt cap are judged by."""
        spec = self.requests[index]
        own = sum(self.prefixes[p] for p in spec.prefix_ids) + spec.unique_len
        if spec.continues is None:
            return own
        earlier = self.requests[spec.continues]
        outputs = earlier.max_tokens if spec.continue_outputs is None else min(spec.continue_outputs, earlier.max_tokens)
        return self.prompt_len(spec.continues) + outputs + own

    def min_prompt_len(self, index: int) -> int:
        """The prompt's shortest length (a continued request aborted before it generated anything)."""
        spec = self.requests[index]
        own = sum(self.prefixes[p] for p in spec.prefix_ids) + spec.unique_len
        return own if spec.continues is None else self.min_prompt_len(spec.continues) + own

    @property
    def uses_connector(self) -> bool:
        """Some request claims KV-connector tokens, or the connector saves: the engine needs a KV
        connector configured (a request the connector defers needs one too)."""
        return (any(r.external_tokens or r.connector_defer for r in self.requests)
                or self.engine.connector_save)

    def max_model_len(self) -> int:
        longest = max((self.prompt_len(i) + r.max_tokens for i, r in enumerate(self.requests)), default=1)
        slack = self.engine.max_model_len_slack
        return longest + (self.engine.num_speculative_tokens + 1 if slack is None else slack)

    def size(self) -> tuple[int, int, int]:
        """(requests, last arrival/abort step, total prompt+output tokens): the minimizer's order."""
        steps = max([r.arrival_step for r in self.requests] + [r.abort_step or 0 for r in self.requests]
                    + [r.step for r in self.prefix_cache_resets] + [0])
        tokens = sum(self.prompt_len(i) + r.max_tokens for i, r in enumerate(self.requests))
        return len(self.requests), steps, tokens

    def liveness_bound(self) -> int:
        """Steps within which every request must finish: each step makes progress on some
        request unless the split defers it, so one step per token plus arrivals is generous.
        Under pipeline stages a request is in at most one of `stages` consecutive batches (vLLM's
        decode stagger), so a token may take that many steps. A reset that preempts the running
        requests may make them compute again all they had computed: its tokens count once more."""
        _, last_step, tokens = self.size()
        deferred = sum(r.connector_defer for r in self.requests)  # schedule() calls a connector deferral takes
        recomputes = sum(1 for r in self.prefix_cache_resets if r.reset_running_requests)
        return (last_step + tokens * (1 + recomputes) * self.engine.pipeline_parallel_size + 8 * len(self.requests)
                + 16 + deferred)

    # ---- JSON ----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "engine": _engine_json(self.engine),
            "prefixes": list(self.prefixes),
            "requests": [_request_json(r) for r in self.requests],
            "acceptance": list(self.acceptance),
            "token_seed": self.token_seed,
        }
        if self.prefix_cache_resets:  # left out when empty: files from before the event stay byte-identical
            out["prefix_cache_resets"] = [dataclasses.asdict(r) for r in self.prefix_cache_resets]
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n"


def _engine_json(e: EngineConfig) -> dict[str, Any]:
    """The engine's fields; `model`, `max_model_len_slack`, `block_size_from_groups`, `scheduling_policy`,
    `connector_failed_sync_load` and `connector_failure_report` only when set (files written before those
    knobs stay byte-identical)."""
    out = dataclasses.asdict(e)
    if out.get("model") == DEFAULT_MODEL:
        del out["model"]
    if out.get("max_model_len_slack") is None:
        out.pop("max_model_len_slack", None)
    if not out.get("block_size_from_groups"):
        out.pop("block_size_from_groups", None)
    if out.get("scheduling_policy") == "fcfs":
        del out["scheduling_policy"]
    if not out.get("connector_failed_sync_load"):
        out.pop("connector_failed_sync_load", None)
    if out.get("connector_failure_report") == "failed_recving":
        del out["connector_failure_report"]
    return out


def _request_json(r: RequestSpec) -> dict[str, Any]:
    out = dataclasses.asdict(r)
    for name in _OPTIONAL_REQUEST_FIELDS:
        if out[name] is None:
            del out[name]
    if not out["priority"]:
        del out["priority"]
    if not out["connector_defer"]:
        del out["connector_defer"]
    return out


@functools.lru_cache(maxsize=128)  # bounded: a long fuzz run sees endless distinct segments
def _segment_tokens_cached(seed: int, key: tuple[str, int], length: int) -> tuple[int, ...]:
    rng = random.Random(f"{seed}/{key[0]}/{key[1]}")
    # Same values as rng.randrange(1, VOCAB_SIZE) (rejection sampling on 10 bits), inlined.
    bits = rng.getrandbits
    span = VOCAB_SIZE - 1
    out = []
    for _ in range(length):
        r = bits(10)
        while r >= span:
            r = bits(10)
        out.append(1 + r)
    return tuple(out)


def _segment_tokens(seed: int, key: tuple[str, int], length: int) -> list[int]:
    return list(_segment_tokens_cached(seed, key, length))


# ---- loading and validation ---------------------------------------------------------

_ENGINE_FIELDS = {f.name: f for f in dataclasses.fields(EngineConfig)}
_REQUEST_FIELDS = {f.name: f for f in dataclasses.fields(RequestSpec)}


def _check_int(problems: list[str], where: str, value: Any, lo: int, hi: int | None = None, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{where} must be an integer, got {value!r}")
    elif value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        problems.append(f"{where} must be {bound}, got {value}")


def _build(cls: type, raw: Any, where: str, fields: dict[str, Any], problems: list[str]) -> Any:
    if not isinstance(raw, dict):
        problems.append(f"{where} must be an object, got {type(raw).__name__}")
        return cls()
    unknown = sorted(set(raw) - set(fields))
    for name in unknown:
        problems.append(f"{where}.{name} is not a known field")
    return cls(**{k: v for k, v in raw.items() if k in fields})


def from_json(raw: Any) -> Scenario:
    """Build and validate a Scenario from parsed JSON; raises ScenarioError listing every problem."""
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise ScenarioError([f"top level must be an object, got {type(raw).__name__}"])
    if raw.get("format") != FORMAT_NAME:
        problems.append(f"format must be {FORMAT_NAME!r}, got {raw.get('format')!r}")
    version = raw.get("version")
    if version not in READABLE_VERSIONS:
        problems.append(f"version must be one of {', '.join(map(str, READABLE_VERSIONS))}, got {version!r}")
    known = {"format", "version", "engine", "prefixes", "requests", "acceptance", "token_seed", "expected", "note", "origin", "finding",
             "engine_confirmation", "expected_by_vllm", "prefix_cache_resets"}
    for name in sorted(set(raw) - known):
        problems.append(f"top-level field {name!r} is not known")
    engine_raw = raw.get("engine", {})
    if version == 1 and isinstance(engine_raw, dict) and "async_scheduling" not in engine_raw:
        engine_raw = {**engine_raw, "async_scheduling": False}
    engine = _build(EngineConfig, engine_raw, "engine", _ENGINE_FIELDS, problems)
    reqs_raw = raw.get("requests", [])
    if not isinstance(reqs_raw, list):
        problems.append("requests must be a list")
        reqs_raw = []
    requests = [_build(RequestSpec, r, f"requests[{i}]", _REQUEST_FIELDS, problems) for i, r in enumerate(reqs_raw)]
    prefixes = raw.get("prefixes", [])
    acceptance = raw.get("acceptance", [])
    resets_raw = raw.get("prefix_cache_resets", [])
    if not isinstance(resets_raw, list):
        problems.append("prefix_cache_resets must be a list of {step, reset_running_requests} objects")
        resets_raw = []
    resets = [_build(PrefixCacheReset, r, f"prefix_cache_resets[{i}]", _RESET_FIELDS, problems)
              for i, r in enumerate(resets_raw)]
    scenario = Scenario(
        engine=engine,
        prefixes=prefixes if isinstance(prefixes, list) else [],
        requests=requests,
        acceptance=acceptance if isinstance(acceptance, list) else [],
        token_seed=raw.get("token_seed", 0),
        prefix_cache_resets=resets,
    )
    if not isinstance(prefixes, list):
        problems.append("prefixes must be a list of lengths")
    if not isinstance(acceptance, list):
        problems.append("acceptance must be a list of counts")
    problems += validate(scenario)
    if problems:
        raise ScenarioError(problems)
    return scenario


def loads(text: str) -> Scenario:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError([f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"]) from None
    except RecursionError:
        raise ScenarioError(["not valid JSON: nested too deeply"]) from None
    return from_json(raw)


def validate(s: Scenario) -> list[str]:
    """Every reason this scenario cannot run, one line each; empty when it is valid.

    Configs vLLM itself refuses (sizes that do not divide, a pool too small for one request)
    are reported here, so they never reach vLLM as crashes."""
    p: list[str] = []
    e = s.engine
    for name, k in knobs().items():
        value = getattr(e, name)
        if k.kind == "int":
            _check_int(p, f"engine.{name}", value, k.lo, k.hi, optional=k.optional)
        elif k.kind == "bool" and not isinstance(value, bool) and not (value is None and k.optional):
            p.append(f"engine.{name} must be true or false{' or null' if k.optional else ''}")
        elif k.kind == "choice" and value not in k.choices and not (value is None and k.optional):
            either = "null or one of" if k.optional else "one of"
            p.append(f"engine.{name} must be {either} {', '.join(k.choices)}, got {value!r}")
    _check_int(p, "token_seed", s.token_seed, 0, (1 << 63) - 1)
    if p:
        return p  # the arithmetic below needs well-typed numbers
    if e.pipeline_parallel_size > 1:
        if e.async_scheduling is False:
            p.append(f"engine.pipeline_parallel_size {e.pipeline_parallel_size} needs async scheduling: the "
                     "synchronous scheduler under pipeline parallelism is not modelled")
        if e.runner is not None and not RUNNERS[e.runner].use_v2_model_runner:
            p.append(f"engine.pipeline_parallel_size {e.pipeline_parallel_size} runs only on Model Runner V2: vLLM "
                     "turns async scheduling off for V1 with pipeline parallelism (config/vllm.py)")
    if e.mamba_block_size % 8:
        p.append(f"engine.mamba_block_size {e.mamba_block_size} must be a multiple of 8 (causal_conv1d alignment)")
    if e.mamba_block_size % e.attn_block_size:
        p.append(f"engine.attn_block_size {e.attn_block_size} must divide mamba_block_size {e.mamba_block_size}")
    unit = e.hash_block_size
    if e.attn_block_size % unit or e.mamba_block_size % unit:
        p.append(f"engine.prefix_match_unit {unit} must divide attn_block_size {e.attn_block_size} and mamba_block_size {e.mamba_block_size}")
    if e.spec_method == "none" and e.num_speculative_tokens:
        p.append("engine.num_speculative_tokens needs spec_method 'mtp'")
    if e.spec_method != "none" and not e.num_speculative_tokens:
        p.append(f"engine.spec_method {e.spec_method!r} needs num_speculative_tokens >= 1")
    if e.spec_method != "none" and e.model != DEFAULT_MODEL and not get_architecture(e.model).mtp_layers:
        p.append(f"engine.spec_method {e.spec_method!r} needs a model with MTP layers; {e.model} ships none")
    if e.num_prefill_checkpoint_blocks and e.model != DEFAULT_MODEL and get_architecture(e.model).mixer != "mamba2":
        p.append(f"engine.num_prefill_checkpoint_blocks needs a Mamba2 model: {e.model}'s GDN layers declare no "
                 "prefill checkpoints (only MambaMixer2.get_kv_cache_spec passes them)")
    if e.num_prefill_checkpoint_blocks and e.prefill_checkpoint_alignment is None:
        p.append("engine.num_prefill_checkpoint_blocks needs prefill_checkpoint_alignment")
    retention = e.prefix_cache_retention_interval
    if retention and retention % e.mamba_block_size:
        p.append(f"engine.prefix_cache_retention_interval {retention} must be a multiple of mamba_block_size {e.mamba_block_size}")
    if e.max_num_batched_tokens < e.max_num_seqs:
        p.append(f"engine.max_num_batched_tokens {e.max_num_batched_tokens} must be >= max_num_seqs {e.max_num_seqs}")
    if e.max_num_batched_tokens < 1 + e.num_speculative_tokens:
        p.append("engine.max_num_batched_tokens must fund one decode step (1 + num_speculative_tokens)")
    if e.connector_failure_report == "invalid_block_ids":
        p.append("engine.connector_failure_report 'invalid_block_ids': vLLM 0.32 raises RuntimeError for block-level "
                 "load failures on a layout with several KV-cache groups, which every hybrid model has "
                 "(Scheduler._handle_invalid_blocks, v1/core/sched/scheduler.py:3366-3374); report 'failed_recving'")

    if not s.requests:
        p.append("requests must not be empty")
    if len(s.requests) > MAX_REQUESTS:
        p.append(f"at most {MAX_REQUESTS} requests, got {len(s.requests)}")
    for i, length in enumerate(s.prefixes):
        _check_int(p, f"prefixes[{i}]", length, 1, MAX_PROMPT_TOKENS)
    for i, count in enumerate(s.acceptance):
        _check_int(p, f"acceptance[{i}]", count, 0, 8)
    if p:
        return p
    for i, r in enumerate(s.requests):
        w = f"requests[{i}]"
        _check_int(p, f"{w}.arrival_step", r.arrival_step, 0, MAX_STEPS_ARRIVAL)
        _check_int(p, f"{w}.continues", r.continues, 0, optional=True)
        if isinstance(r.continues, int) and not isinstance(r.continues, bool) and r.continues >= i:
            p.append(f"{w}.continues must name an earlier request (0..{i - 1}), got {r.continues}" if i
                     else f"{w}.continues must name an earlier request, and requests[0] has none")
        _check_int(p, f"{w}.continue_outputs", r.continue_outputs, 0, MAX_OUTPUT_TOKENS, optional=True)
        if r.continue_outputs is not None and r.continues is None:
            p.append(f"{w}.continue_outputs needs continues")
        # a continuation's prompt already holds the earlier request's: its own tail may be empty
        _check_int(p, f"{w}.unique_len", r.unique_len, 0 if r.continues is not None else 1, MAX_PROMPT_TOKENS)
        _check_int(p, f"{w}.max_tokens", r.max_tokens, 1, MAX_OUTPUT_TOKENS)
        _check_int(p, f"{w}.external_tokens", r.external_tokens, 0, MAX_PROMPT_TOKENS)
        _check_int(p, f"{w}.abort_step", r.abort_step, 0, MAX_STEPS_ARRIVAL + MAX_PROMPT_TOKENS, optional=True)
        _check_int(p, f"{w}.priority", r.priority, 0, MAX_PRIORITY)
        _check_int(p, f"{w}.connector_defer", r.connector_defer, 0, MAX_CONNECTOR_DEFER)
        if not isinstance(r.external_async, bool):
            p.append(f"{w}.external_async must be true or false")
        if not isinstance(r.abort_in_flight, bool):
            p.append(f"{w}.abort_in_flight must be true or false")
        elif r.abort_in_flight and r.abort_step is None:
            p.append(f"{w}.abort_in_flight needs an abort_step")
        if not isinstance(r.prefix_ids, list) or any(
            isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < len(s.prefixes) for x in r.prefix_ids
        ):
            p.append(f"{w}.prefix_ids must list indexes into prefixes (0..{len(s.prefixes) - 1})")
    _check_resets(p, s)
    if p:
        return p
    for i, r in enumerate(s.requests):
        w = f"requests[{i}]"
        plen = s.prompt_len(i)
        if plen > MAX_PROMPT_TOKENS:
            p.append(f"{w} prompt is {plen} tokens, more than {MAX_PROMPT_TOKENS}")
        shortest = s.min_prompt_len(i)
        if r.external_tokens >= shortest:
            p.append(f"{w}.external_tokens {r.external_tokens} must be below its prompt length {shortest}")
        if r.abort_step is not None and r.abort_step < r.arrival_step:
            p.append(f"{w}.abort_step {r.abort_step} is before its arrival_step {r.arrival_step}")
    if s.requests and e.long_prefill_token_threshold > s.max_model_len():
        p.append(f"engine.long_prefill_token_threshold {e.long_prefill_token_threshold} exceeds the longest "
                 f"request ({s.max_model_len()} tokens); vLLM refuses it")
    if e.num_gpu_blocks is not None and not p:
        need = min_pool_blocks(s)
        if e.num_gpu_blocks < need:
            p.append(f"engine.num_gpu_blocks {e.num_gpu_blocks} is below {need}, vLLM's start-up minimum for the "
                     "longest request (counted per KV-cache group; for a model with padded groups vLLM's own is at "
                     "most a few blocks lower)")
    return p


MAX_RESET_STEP = MAX_STEPS_ARRIVAL + MAX_PROMPT_TOKENS  # as abort_step: a reset may come at any step of a run


def _check_resets(p: list[str], s: Scenario) -> None:
    """`prefix_cache_resets`: well-typed, in step order, one a step, and not a combination vLLM 0.32 refuses."""
    last = -1
    for i, r in enumerate(s.prefix_cache_resets):
        w = f"prefix_cache_resets[{i}]"
        before = len(p)
        _check_int(p, f"{w}.step", r.step, 0, MAX_RESET_STEP)
        if not isinstance(r.reset_running_requests, bool):
            p.append(f"{w}.reset_running_requests must be true or false")
        if len(p) > before:
            continue
        if r.step <= last:
            p.append(f"{w}.step {r.step} must come after the previous reset's step {last} (one reset a step, in order)")
        last = r.step
        # With a KV connector, blocks stay in use after every running request is preempted: a request
        # waiting for a remote load holds its blocks, a finished one's are freed only when its send
        # finishes, and a consumer connector under a batch queue defers every free (scheduler.py:186-192,
        # `_free_request_blocks`). Scheduler.reset_prefix_cache then raises RuntimeError ("not supported
        # yet", scheduler.py:2868-2874) instead of resetting.
        if r.reset_running_requests and s.uses_connector:
            p.append(f"{w}.reset_running_requests needs a scenario without a KV connector: vLLM 0.32 raises when a "
                     "connector still holds blocks after the preemption (Scheduler.reset_prefix_cache)")


def engine_realism_notes(e: EngineConfig) -> list[str]:
    """Ways a config is reachable only at scheduler level, not in a real engine: a finding on such
    a config should be re-checked on an engine-real one before anyone calls it a vLLM bug."""
    notes = []
    if e.enable_prefix_caching and e.attn_block_size != e.mamba_block_size:
        notes.append(f"attn_block_size {e.attn_block_size} != mamba_block_size {e.mamba_block_size}: a real align-mode "
                     "engine ties the two (Platform._align_hybrid_block_size); only the scheduler sees this config")
    if e.enable_prefix_caching and e.block_size_from_groups and e.attn_block_size < e.mamba_block_size:
        notes.append(f"block_size_from_groups: cache_config.block_size is {e.attn_block_size}, below the mamba block "
                     f"{e.mamba_block_size}; a real engine gets there only with a prefix-cacheable group finer than "
                     "the mamba block beside the model's own (vLLM 0.32 names a DFlash drafter group, "
                     "mamba_hybrid.py:118-120; upstream reports no config that reaches it, vllm-project/vllm#54076)")
    need = get_architecture(e.model).vllm_block_size if e.model in MODELS else 0
    if e.enable_prefix_caching and e.mamba_block_size < need:
        notes.append(f"mamba_block_size {e.mamba_block_size} < {need}: vLLM raises the block size of {e.model} to at least "
                     f"{need} tokens so an attention page holds its mamba state (Platform._align_hybrid_block_size); "
                     "only the scheduler sees this config")
    return notes


# The shipped tiny model has three linear-attention layers beside one attention layer; vLLM's
# uniform-page grouping gives each its own KV-cache group, so a request holds three mamba block tables.
# Another `engine.model` declares its own count (mambafuzz/model/architectures.py `mamba_groups`).
MAMBA_GROUPS = get_architecture(DEFAULT_MODEL).mamba_groups


def blocks_for_request(e: EngineConfig, num_tokens: int) -> int:
    """Blocks one request holds at most: attention blocks for every token, plus each mamba
    group's resident state blocks in align mode (two, plus speculative and checkpoint blocks)."""
    attn = -(-num_tokens // e.attn_block_size)
    # align mode keeps 2 state blocks resident; vLLM's admission check (scheduler_reserve_full_isl)
    # counts one per mamba block of the whole sequence with prefix caching off: take the larger.
    per_group = max(2, -(-num_tokens // e.mamba_block_size)) + e.num_speculative_tokens + e.num_prefill_checkpoint_blocks
    mamba = get_architecture(e.model).mamba_groups * per_group
    # + slack for the null block and the allocator's watermark (1% of the pool)
    return attn + mamba + 4 + (attn + mamba) // 50


def startup_pool_blocks(e: EngineConfig, max_model_len: int) -> int:
    """The smallest pool vLLM starts with for `e` (the engine's start-up check, `get_kv_cache_configs`):
    one request of `max_model_len` tokens at its largest, per KV-cache group (the attention blocks of
    every token; each mamba group's resident blocks: 2 + speculative + checkpoint in align mode, 1 +
    speculative with prefix caching off), plus the null block the pool holds back. The engine charges
    each group whole blocks, padding included, so this is vLLM's own figure
    (mambafuzz.sim.bridge.configs.startup_min_blocks computes it with vLLM's specs;
    tests/sim/test_pool_floor.py holds the two equal)."""
    spec = e.num_speculative_tokens if e.uses_spec_decode else 0
    per_group = 2 + spec + e.num_prefill_checkpoint_blocks if e.enable_prefix_caching else 1 + spec
    return -(-max_model_len // e.attn_block_size) + get_architecture(e.model).mamba_groups * per_group + 1


def min_pool_blocks(s: Scenario) -> int:
    """The smallest pool a scenario may name: vLLM's start-up minimum for its longest request."""
    return startup_pool_blocks(s.engine, s.max_model_len())


def with_runner(s: Scenario, runner: str | None) -> Scenario:
    """`s` under another model runner (None: keep the scenario's own)."""
    if runner is None or runner == s.engine.runner:
        return s
    if runner not in RUNNERS:
        raise ScenarioError([f"runner must be one of {', '.join(RUNNERS)}, got {runner!r}"])
    return _revalidated(dataclasses.replace(s, engine=dataclasses.replace(s.engine, runner=runner)))


def _revalidated(s: Scenario) -> Scenario:
    """`s`, or ScenarioError when the override made it a config that is not modelled (pipeline
    stages off Model Runner V2 or without async scheduling)."""
    problems = validate(s) if s.engine.pipeline_parallel_size > 1 else []
    if problems:
        raise ScenarioError(problems)
    return s


SCHEDULING_MODES = {"sync": False, "async": True, "default": None}  # --scheduling -> engine.async_scheduling


def with_scheduling(s: Scenario, mode: str | None) -> Scenario:
    """`s` under another scheduling mode (None: keep the scenario's own): "sync" (vLLM's Scheduler,
    one batch at a time), "async" (AsyncScheduler under a batch queue) or "default" (vLLM's pick)."""
    if mode is None:
        return s
    if mode not in SCHEDULING_MODES:
        raise ScenarioError([f"scheduling must be one of {', '.join(SCHEDULING_MODES)}, got {mode!r}"])
    return _revalidated(dataclasses.replace(s, engine=dataclasses.replace(s.engine, async_scheduling=SCHEDULING_MODES[mode])))


def ample_pool_blocks(s: Scenario) -> int:
    """A pool that holds every request at once plus a cache's worth: nothing is preempted."""
    total = sum(blocks_for_request(s.engine, s.prompt_len(i) + r.max_tokens + s.engine.num_speculative_tokens + 1)
                for i, r in enumerate(s.requests))
    return 2 * total + 16
