"""The one definition of the input space, shared by every generator.

`draw_scenario(src)` asks a `Source` for integers and booleans, one named dimension at a
time; three sources feed it:
- `RandomSource`: a seeded `random.Random` (the feedback-free baseline generator);
- `BytesSource`: a byte string, through atheris' `FuzzedDataProvider` when atheris is
  installed (libFuzzer mutates the bytes; any byte string decodes to a valid scenario);
- `HypothesisSource`: Hypothesis' `data.draw` (property tests and shrinking; `scenarios()`).

Dimensions are encoded relative to the mamba block (prompt lengths, budgets, offsets), so
every block size gets chunk ends before, at and after its boundaries.  Nothing here knows
any particular bug.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Iterator
from typing import Protocol

from mambafuzz.model.architectures import ARCHITECTURES, DEFAULT_MODEL
from mambafuzz.model.architectures import get as get_architecture
from mambafuzz.model.scenario import (
    MAX_PROMPT_TOKENS,
    EngineConfig,
    Knob,
    PrefixCacheReset,
    RequestSpec,
    Scenario,
    ample_pool_blocks,
    knobs,
    min_pool_blocks,
    validate,
)

BASE_BLOCK_SIZES = (8, 16, 32)  # the finest block; mamba blocks are multiples, hash units divisors
MAX_GEN_REQUESTS = 5
MAX_GEN_PREFIXES = 3


class Source(Protocol):
    def int(self, lo: int, hi: int) -> int: ...
    def bool(self) -> bool: ...


class RandomSource:
    def __init__(self, rng: random.Random):
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def bool(self) -> bool:
        return self.rng.random() < 0.5


class BytesSource:
    """Consumes a byte string through atheris' FuzzedDataProvider (a plain big-endian reader
    when atheris is absent).  Past the end of the bytes, draws come from a PRNG seeded by the
    bytes themselves: short inputs still decode to varied scenarios, and libFuzzer's longer
    inputs take over the leading dimensions one by one."""

    def __init__(self, data: bytes):
        try:
            import atheris

            self._fdp = atheris.FuzzedDataProvider(data)
        except ImportError:
            self._fdp = None
        self._data = data
        self._pos = 0
        self._tail: random.Random | None = None

    def _remaining(self) -> int:
        return self._fdp.remaining_bytes() if self._fdp is not None else len(self._data) - self._pos

    def int(self, lo: int, hi: int) -> int:
        if hi <= lo:
            return lo
        span = hi - lo
        nbytes = (span.bit_length() + 7) // 8
        if self._remaining() < nbytes:
            if self._tail is None:
                self._tail = random.Random(self._data)
            return self._tail.randint(lo, hi)
        if self._fdp is not None:
            return self._fdp.ConsumeIntInRange(lo, hi)
        chunk = self._data[self._pos : self._pos + nbytes]
        self._pos += nbytes
        return lo + int.from_bytes(chunk, "big") % (span + 1)

    def bool(self) -> bool:
        return self.int(0, 1) == 1


class HypothesisSource:
    def __init__(self, draw):
        from hypothesis import strategies as st

        self._draw = draw
        self._st = st

    def int(self, lo: int, hi: int) -> int:
        return self._draw(self._st.integers(lo, max(lo, hi)))

    def bool(self) -> bool:
        return self._draw(self._st.booleans())


def _pick(src: Source, options: tuple | list):
    return options[src.int(0, len(options) - 1)]


def _length(src: Source, block: int, most_blocks: int = 3) -> int:
    """A token count spread over [1, most_blocks * block], often near block boundaries."""
    if src.bool():
        return src.int(1, most_blocks * block)
    boundary = src.int(1, most_blocks) * block
    return max(1, boundary + src.int(-3, 3))


def draw_engine(src: Source) -> EngineConfig:
    base = _pick(src, BASE_BLOCK_SIZES)
    mamba = base * _pick(src, (1, 2, 3, 4, 8, 16, 50, 100))
    # Half the time the attention block equals the mamba block, as a real align-mode engine sets it;
    # otherwise it is the finer base block, a config only the scheduler sees (mambafuzz.model.scenario.engine_realism_notes).
    attn = mamba if src.bool() else base
    units = [d for d in range(1, base + 1) if base % d == 0]
    unit = _pick(src, units + [None, None])
    spec_tokens = src.int(0, 3) if src.bool() else 0
    budget = max(1 + spec_tokens, _length(src, mamba, 4))
    threshold = src.int(1, min(budget, 2 * mamba)) if src.int(0, 3) == 0 else 0
    checkpoint = src.int(0, 3) == 0
    retention = _pick(src, (0, 0, None, mamba, 2 * mamba))
    engine = EngineConfig(
        mamba_block_size=mamba,
        attn_block_size=attn,
        prefix_match_unit=unit,
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_num_seqs=src.int(1, min(8, budget)),
        spec_method="mtp" if spec_tokens else "none",
        num_speculative_tokens=spec_tokens,
        num_prefill_checkpoint_blocks=1 if checkpoint else 0,
        prefill_checkpoint_alignment=_pick(src, (1, unit or mamba)) if checkpoint else None,
        enable_mamba_shared_prefix_checkpoint=src.int(0, 3) == 0,
        prefix_cache_retention_interval=retention,
    )
    for name, k in knobs().items():  # a knob with no distribution of its own gets a generic one
        if k.generate and name not in DRAWN_HERE:
            setattr(engine, name, draw_knob(src, k))
    return engine


# The knobs draw_engine and draw_scenario give hand-made distributions (block boundaries,
# divisors, budgets that fragment chunks); every other knob is drawn by draw_knob.
DRAWN_HERE = frozenset({
    "mamba_block_size", "attn_block_size", "prefix_match_unit", "max_num_batched_tokens",
    "long_prefill_token_threshold", "max_num_seqs", "spec_method", "num_speculative_tokens",
    "num_prefill_checkpoint_blocks", "prefill_checkpoint_alignment", "enable_mamba_shared_prefix_checkpoint",
    "prefix_cache_retention_interval", "num_gpu_blocks", "async_scheduling", "model",
})


def draw_knob(src: Source, k: Knob) -> object:
    """A value from a knob's declared range: its simplest value half of the time."""
    if k.kind == "bool":
        return None if k.optional and src.bool() else src.bool()
    if k.kind == "choice":
        return _pick(src, k.choices)
    if k.optional and src.bool():
        return None
    if src.bool() and k.simplest is not None:
        return k.simplest
    return src.int(k.lo, min(k.hi if k.hi is not None else k.lo + 64, k.lo + 64))


def draw_scenario(src: Source) -> Scenario:
    engine = draw_engine(src)
    block = engine.mamba_block_size
    prefixes = [min(_length(src, block), 2000) for _ in range(src.int(0, MAX_GEN_PREFIXES))]
    requests = []
    for _ in range(src.int(1, MAX_GEN_REQUESTS)):
        prefix_ids = [src.int(0, len(prefixes) - 1) for _ in range(src.int(0, 2))] if prefixes else []
        arrival = src.int(0, 8)
        req = RequestSpec(
            arrival_step=arrival,
            prefix_ids=prefix_ids,
            unique_len=min(_length(src, block, 2), 3000),
            max_tokens=src.int(1, 8),
            abort_step=arrival + src.int(0, 12) if src.int(0, 5) == 0 else None,
        )
        requests.append(req)
    scenario = Scenario(engine=engine, prefixes=prefixes, requests=requests,
                        acceptance=[src.int(0, engine.num_speculative_tokens) for _ in range(src.int(0, 4))]
                        if engine.num_speculative_tokens else [],
                        token_seed=src.int(0, 3))
    while len(requests) > 1 and sum(scenario.prompt_len(i) for i in range(len(requests))) > 4 * 8192 // 3:
        requests.pop()
    for i, req in enumerate(requests):  # connector hits need the prompt length
        if src.int(0, 3) == 0:
            plen = scenario.prompt_len(i)
            if plen > 1:
                req.external_tokens = src.int(1, plen - 1)
                req.external_async = src.bool()
    limit = scenario.max_model_len()
    if engine.long_prefill_token_threshold > limit:
        engine.long_prefill_token_threshold = limit
    if src.int(0, 3) == 0:
        lo, hi = min_pool_blocks(scenario), ample_pool_blocks(scenario)
        engine.num_gpu_blocks = min(src.int(lo, lo + max(1, (hi - lo) // 4)), 4096)
    # Drawn last, so every earlier draw (and an input recorded before the knob existed) decodes
    # as it did: vLLM's default (async in 0.32) half of the time, each explicit mode a quarter.
    engine.async_scheduling = draw_knob(src, knobs()["async_scheduling"])
    for req in requests:
        if req.abort_step is not None:
            req.abort_in_flight = src.bool()
    # Pipeline-parallel stages, drawn after everything else (older inputs decode as before): one
    # scenario in eight, and only where it is modelled (async scheduling; Model Runner V2 is vLLM's
    # pick, and a campaign's --runner v1 makes such a scenario invalid, one line).
    if engine.async_scheduling is not False and src.int(0, 7) == 0:
        engine.pipeline_parallel_size = src.int(2, knobs()["pipeline_parallel_size"].hi)
    # Drawn after everything else (the stages too), so an input recorded before the knob decodes to the same fields
    # (plus a model): the tiny default half of the time, otherwise an architecture the config suits.
    # Only the model changes: with it set back to the default the scenario is the one drawn before the knob.
    engine.model = draw_model(src, scenario)
    for name in LATE_DRAWS:  # by name, so a test or bench can leave one out (and every one after it)
        globals()[name](src, scenario)
    return scenario


# The draws made after every field above, in order, each added after the ones before it so that an
# input recorded earlier decodes to the same scenario plus the new draw: request links, the connector's
# behaviour, priorities, its answers and the prefix-cache resets change no other field; the load burst and decode pressure
# revise earlier fields only where they fire. A new draw goes at the end.
LATE_DRAWS = ("_draw_continuations", "_draw_connector", "_draw_priorities", "_draw_load_burst",
              "_draw_decode_pressure", "_draw_connector_answers", "_draw_prefix_cache_resets")


def draws_from(name: str) -> tuple[str, ...]:
    """`name` and every late draw after it: what a caller leaves out to get the scenarios drawn before
    `name` existed (each later draw would otherwise read another part of the input)."""
    return LATE_DRAWS[LATE_DRAWS.index(name):]


@contextlib.contextmanager
def late_draws_left_out(first: str | None) -> Iterator[None]:
    """Inside the block, `first` and every late draw after it (`draws_from`) draw nothing, for every
    way a scenario is drawn (a seed, bytes, Hypothesis): the scenarios a tree before `first` drew.
    For the benches and tests that measure one draw's effect; None leaves nothing out. Restored on
    exit."""
    module = globals()
    saved = {name: module[name] for name in (draws_from(first) if first is not None else ())}
    module.update(dict.fromkeys(saved, _no_draw))
    try:
        yield
    finally:
        module.update(saved)


def _no_draw(src: Source, scenario: Scenario) -> None:
    """A late draw left out (`late_draws_left_out`)."""


def _draw_prefix_cache_resets(src: Source, scenario: Scenario) -> None:
    """The engine's `reset_prefix_cache` calls (Scenario.prefix_cache_resets) in one scenario of eight with two
    requests or more: one or two, early in the run (steps 1-16, where requests are running or have just
    published), each preempting the running requests half the time (never with a KV connector: vLLM 0.32
    raises there, the validator says why). Drawn after every other dimension and changing none of them:
    an input recorded before the event decodes to the same scenario, with resets in an eighth of the cases."""
    if len(scenario.requests) < 2 or src.int(0, 7):
        return
    step = 0
    resets = []
    for _ in range(src.int(1, 2)):
        step = src.int(step + 1, step + 12)
        running = src.bool() and not scenario.uses_connector
        resets.append(PrefixCacheReset(step, running))
    scenario.prefix_cache_resets = resets


def _near(src: Source, most: int) -> int:
    """An offset from an edge: the edge itself half the time, else up to `most` either side."""
    return 0 if src.bool() else src.int(-most, most)


def _draw_load_burst(src: Source, scenario: Scenario) -> None:
    """A prefill instance's hand-off to a P/D decode instance under memory pressure, in half of the
    scenarios whose requests load asynchronously: the shape the upstream reports of parked-load
    deadlocks describe (vllm-project/vllm#44560, #45406, #57104: concurrent async loads of whole
    prompts that fill the pool between them). Each edge is drawn on its own:
    - every other request with a prompt to hand over joins the loads, half the time each;
    - the loads' prompts end at the attention block grid (or within 3 tokens of it), half the time;
    - the loads take the whole prompt but one token (as a P/D transfer hands it over), 3 times in 4;
    - they arrive together, and max_num_seqs admits them all (all parked at once), 3 times in 4;
    - the pool is the blocks the parked loads hold between them (each its loaded attention blocks and
      1 + k state blocks per mamba group, plus the null block), or one block either side, 3 times in 4; no
      lower than vLLM's start-up minimum.
    Spec decoding, the model and every other dimension are left as drawn, so the edge serves any
    reservation between parked loads, not one config. Drawn after every other dimension: an input
    recorded before it decodes to the same scenario unless it fires; an edit that would make the
    scenario invalid is not made (none of it is)."""
    requests = scenario.requests
    loads = [i for i, r in enumerate(requests) if r.external_tokens and r.external_async]
    if not loads or src.bool():
        return
    e = dataclasses.replace(scenario.engine)
    edited = dataclasses.replace(scenario, engine=e,
                                 requests=[dataclasses.replace(r, prefix_ids=list(r.prefix_ids)) for r in requests])
    reqs = edited.requests
    for i, r in enumerate(reqs):
        joins = src.bool()
        if joins and i not in loads and r.continues is None and edited.prompt_len(i) > 1:
            r.external_tokens, r.external_async = edited.prompt_len(i) - 1, True
            loads.append(i)
    whole, together, edge, spread = src.int(0, 3), src.int(0, 3), src.int(0, 3), _near(src, 1)
    if src.bool():  # prompts that end at the attention block grid or within 3 tokens of it
        a = e.attn_block_size
        for i in loads:
            plen, r = edited.prompt_len(i), reqs[i]
            end = max(a, (plen + a // 2) // a * a) + _near(src, 3)
            r.unique_len = max(r.unique_len + end - plen, 0 if r.prefix_ids else 1)
    if whole:
        for i in loads:
            reqs[i].external_tokens = edited.prompt_len(i) - 1
    if together:  # and admitted together: max_num_seqs holds the burst where the budget allows
        first = min(reqs[i].arrival_step for i in loads)
        for i in loads:
            reqs[i].arrival_step = first
        e.max_num_seqs = max(e.max_num_seqs, min(len(loads), e.max_num_batched_tokens))
    if edge:
        groups = get_architecture(e.model).mamba_groups
        spec = e.num_speculative_tokens if e.uses_spec_decode else 0
        held = 1 + sum(-(-reqs[i].external_tokens // e.attn_block_size) + groups * (1 + spec) for i in loads)
        e.num_gpu_blocks = min(max(held + spread, min_pool_blocks(edited)), 4096)
    if not validate(edited):
        scenario.engine, scenario.requests[:] = e, reqs


MAX_PRESSURE_OUTPUT_TOKENS = 64  # a decode drawn to outgrow the pool stays this short (executions stay cheap)


def _draw_decode_pressure(src: Source, scenario: Scenario) -> None:
    """Decodes that outgrow the pool, in one scenario of six with two requests or more. Before it,
    1.1% of the generator's executions preempted a request that had sampled (bench/pair_coverage.py:
    the rarest dimension, and every pair under 1% involved a preemption), while vLLM's resume path
    (a re-prefill of prompt and outputs, prefill_end past the prompt, a stale output in flight)
    is where many surviving mutants live (bench/mutation_classes.json: "needs a preempted request
    with outputs"). Each edge is drawn on its own:
    - each request's decode runs 1 to 3 attention blocks past its prompt's last block boundary
      (at most MAX_PRESSURE_OUTPUT_TOKENS tokens): every request's, 3 times in 4 (so the requests
      are decoding together when the pool runs out, and the victim has sampled), else each by a coin;
    - the requests arrive together (continuations excepted) and max_num_seqs admits them all, half
      the time;
    - the pool is drawn between vLLM's start-up minimum and one block less than the requests would
      hold at their ends together (each its attention blocks and 1 + k state blocks per mamba group,
      plus the null block), 3 times in 4: shared prefixes, prefills that end at other steps and
      requests that finish early hold less than that sum, so a pool just under it is often enough.
    Everything else stays as drawn (spec decode, scheduling, connector, model), so the pressure
    meets every other dimension. Drawn after every other draw: an input recorded before it decodes
    to the same scenario unless it fires; an edit that would make the scenario invalid is not made."""
    requests = scenario.requests
    if len(requests) < 2 or src.int(0, 5):
        return
    e = dataclasses.replace(scenario.engine)
    edited = dataclasses.replace(scenario, engine=e,
                                 requests=[dataclasses.replace(r, prefix_ids=list(r.prefix_ids)) for r in requests])
    reqs = edited.requests
    a = e.attn_block_size
    every = src.int(0, 3)  # every request decodes past its prompt's blocks (3 times in 4), else each by a coin
    for i, r in enumerate(reqs):
        if (every or src.bool()) and r.continues is None:
            past = a - edited.prompt_len(i) % a  # tokens to the prompt's next attention block boundary
            r.max_tokens = min(max(r.max_tokens, past + src.int(0, 2) * a + src.int(1, a)), MAX_PRESSURE_OUTPUT_TOKENS)
    together, tight = src.bool(), src.int(0, 3)
    fresh = [r for r in reqs if r.continues is None]  # a continuation arrives when its earlier request ends
    if together and len(fresh) > 1:
        first = min(r.arrival_step for r in fresh)
        for r in fresh:
            r.arrival_step = first
        e.max_num_seqs = max(e.max_num_seqs, min(len(fresh), e.max_num_batched_tokens))
    if tight:
        groups = get_architecture(e.model).mamba_groups
        spec = e.num_speculative_tokens if e.uses_spec_decode else 0
        held = 1 + sum(-(-(edited.prompt_len(i) + r.max_tokens + spec) // a) + groups * (1 + spec)
                       for i, r in enumerate(reqs))
        # shared prefixes, prefills that end at other steps and requests that finish early hold less
        # than that: anywhere from vLLM's start-up minimum up to it, less one
        floor = min_pool_blocks(edited)
        e.num_gpu_blocks = min(src.int(floor, max(floor, held - 1)), 4096)
    if not validate(edited):
        scenario.engine, scenario.requests[:] = e, reqs


def _draw_connector_answers(src: Source, scenario: Scenario) -> None:
    """How the attached KV connector answers, in one scenario of three that has one: half of the
    requests get a deferral (`RequestSpec.connector_defer`, 1-3 schedule() calls answered None, as an
    offloading connector answers while a hit block is still being written: vllm-project/vllm#45406,
    #57841 start from it). Drawn after every other dimension and changing none of them, so an input
    recorded before the knob decodes to the same scenario plus it.
    A failed synchronous load (`EngineConfig.connector_failed_sync_load`) is not drawn: on vLLM 0.32
    every such input fails the same way (the untriaged candidate
    corpus/untriaged/connector_failed_sync_load_runs_on_unwritten_state.json), so a campaign would stop
    on it within seconds and its signature would hide any other finding."""
    if not scenario.uses_connector or src.int(0, 2):
        return
    for req in scenario.requests:
        req.connector_defer = src.int(1, 3) if src.bool() else 0


def _draw_priorities(src: Source, scenario: Scenario) -> None:
    """vLLM's priority scheduling in one scenario of six with two requests or more, each request a
    priority in [0, 3] (so ties, where arrival decides, are common). Drawn after every other
    dimension and changing none of them: an input recorded before the knob decodes to the same
    scenario, under "priority" in a sixth of the cases."""
    if len(scenario.requests) < 2 or src.int(0, 5):
        return
    scenario.engine.scheduling_policy = "priority"
    for req in scenario.requests:
        req.priority = src.int(0, 3)


CONNECTOR_KNOBS = ("connector_save", "connector_send_steps", "connector_load_source", "connector_recv_steps",
                   "connector_failed_load", "connector_failure_policy", "connector_divergent_hits")
# Engine connector knobs the generator leaves at their defaults: a failed sync load fails every input the
# same way on vLLM 0.32 (`_draw_connector_answers`), and block-level reports are refused by the validator.
UNDRAWN_CONNECTOR_KNOBS = ("connector_failed_sync_load", "connector_failure_report")


def _draw_connector(src: Source, scenario: Scenario) -> None:
    """How the KV connector behaves (mambafuzz/sim/engine/connector.py: saves, loads of saved states,
    multi-step and failing async loads, divergent hybrid hits), in half of the scenarios whose
    requests claim connector tokens; their defaults (a connector that only loads the truth within a
    step) stay in the rest. Steps are kept short (0-3) so the saves and loads land inside a run."""
    if not any(r.external_tokens for r in scenario.requests) or src.bool():
        return
    engine, k = scenario.engine, knobs()
    for name in CONNECTOR_KNOBS:
        if name in ("connector_send_steps", "connector_recv_steps"):
            value = src.int(0, 3)
        elif name == "connector_failed_load":
            loads = sum(1 for r in scenario.requests if r.external_tokens and r.external_async)
            value = src.int(0, loads) if loads else 0
        else:
            value = draw_knob(src, k[name])
        setattr(engine, name, value)


def draw_model(src: Source, scenario: Scenario) -> str:
    """`engine.model`: the default half of the time, else one of the registered architectures the drawn
    config can run on (MTP needs drafter layers; prefill checkpoints need a Mamba2 mixer; a drawn pool must
    hold the longest request with the model's mamba groups)."""
    if src.bool():
        return DEFAULT_MODEL
    engine = scenario.engine
    fits = [a.name for a in ARCHITECTURES.values() if a.name != DEFAULT_MODEL
            and (a.mtp_layers or engine.spec_method == "none")
            and (a.mixer == "mamba2" or not engine.num_prefill_checkpoint_blocks)
            and (engine.num_gpu_blocks is None or engine.num_gpu_blocks >= min_pool_blocks(
                dataclasses.replace(scenario, engine=dataclasses.replace(engine, model=a.name))))]
    return _pick(src, fits) if fits else DEFAULT_MODEL


def _draw_continuations(src: Source, scenario: Scenario) -> None:
    """Chains of turns: a share of requests continue an earlier one (its prompt plus some or all of
    what it generated, then their own tail). A continuation of a request that may be aborted takes
    none of its outputs half of the time: a retry of the same prompt (plus its tail). Drawn after
    every other dimension and changing none of them, so an input recorded before continuations
    existed decodes to the same requests, some now linked; a link that would make a prompt too long
    for the limits or the drawn pool is not made."""
    requests = scenario.requests
    for i, req in enumerate(requests):
        if not i or src.int(0, 3):
            continue
        j = src.int(0, i - 1)
        earlier = requests[j]
        if earlier.abort_step is not None and src.bool():
            outputs = 0
        else:
            outputs = None if src.bool() else src.int(0, earlier.max_tokens)
        req.continues, req.continue_outputs = j, outputs
        pool = scenario.engine.num_gpu_blocks
        if (scenario.prompt_len(i) > MAX_PROMPT_TOKENS
                or sum(scenario.prompt_len(k) for k in range(len(requests))) > 4 * 8192 // 3
                or scenario.engine.long_prefill_token_threshold > scenario.max_model_len()
                or (pool is not None and pool < min_pool_blocks(scenario))):
            req.continues = req.continue_outputs = None


def scenario_from_bytes(data: bytes) -> Scenario:
    return draw_scenario(BytesSource(data))


def random_scenario(rng: random.Random) -> Scenario:
    return draw_scenario(RandomSource(rng))


def scenarios():
    """The Hypothesis strategy over the same input space."""
    from hypothesis import strategies as st

    @st.composite
    def _scenarios(draw):
        return draw_scenario(HypothesisSource(draw))

    return _scenarios()


def draw_worker_rows(src: Source, scenario: Scenario) -> Scenario:
    """The conform target's second pass over a drawn scenario: the dimensions that decide which
    branch vLLM's worker code takes for a row (mambafuzz/conform/row_classes.py) drawn toward
    their edges, each independently, so rare row classes and pairs of them come up on purpose:
    - a small block grid (lengths scaled with it), so the edits below stay cheap;
    - spec decoding (most worker branches are spec rows: drafts, cut drafts, no drafts);
    - a chunk limit of 1 to k+1 tokens (the scheduler cuts a decode's drafts to fit it);
    - a token budget of k+1 to a few rows' worth (later rows of a step get fewer drafts);
    - a max_model_len with less than k+1 tokens of slack (drafts cut near a request's end, after
      steps that accepted some);
    - prompt tails of one token after a prefix or a connector load (a one-token chunk with
      prior state, or a tail the scheduler pads with placeholder drafts);
    - one-token prompts (a first chunk of one token);
    - cache_config.block_size below the mamba block (engine.block_size_from_groups).
    Each edit is kept only if the scenario stays a valid config; returns a revised copy (the
    input is not changed). Every draw is made whether or not its edit is kept."""
    s = scenario
    for edit in _ROW_EDGE_EDITS:
        candidate = edit(src, dataclasses.replace(
            s, engine=dataclasses.replace(s.engine), acceptance=list(s.acceptance),
            requests=[dataclasses.replace(r, prefix_ids=list(r.prefix_ids)) for r in s.requests]))
        if candidate is not None and not validate(candidate):
            s = candidate
    return s


def _edge_geometry(src: Source, s: Scenario) -> Scenario | None:
    """The scenario on a small mamba block (8 to 32 tokens), every length scaled with it
    (mambafuzz.model.geometry): the row classes are those of the same grid, and the edits below
    that shrink a step to a few tokens then cost tens of steps, not thousands."""
    from mambafuzz.model.geometry import scaled, smaller_blocks

    options = [b for b in smaller_blocks(s.engine.mamba_block_size) if b <= 32]
    pick, on = src.int(0, 2), src.int(0, 3) != 0
    return scaled(s, options[pick % len(options)]) if options and on else None


def _edge_spec(src: Source, s: Scenario) -> Scenario | None:
    e = s.engine
    k, acceptance = src.int(1, 3), [src.int(0, 3) for _ in range(src.int(1, 4))]
    if e.uses_spec_decode or not src.bool():  # a model without MTP layers fails validation: edit dropped
        return None
    e.spec_method, e.num_speculative_tokens = "mtp", k
    e.max_num_batched_tokens = max(e.max_num_batched_tokens, k + 1)
    s.acceptance = [min(a, k) for a in acceptance]
    return s


def _spec_tokens(s: Scenario) -> int:
    return s.engine.num_speculative_tokens if s.engine.uses_spec_decode else 0


def _edge_chunk_limit(src: Source, s: Scenario) -> Scenario | None:
    k, limit, on = _spec_tokens(s), src.int(1, 4), src.int(0, 2) == 0
    if not (k and on):
        return None
    s.engine.long_prefill_token_threshold = min(limit, k + 1)
    return s


def _edge_budget(src: Source, s: Scenario) -> Scenario | None:
    e, k = s.engine, _spec_tokens(s)
    budget, on = (k + 1) * src.int(1, 3) + src.int(0, k), src.int(0, 3) == 0
    if not on:
        return None
    e.max_num_batched_tokens = budget
    e.max_num_seqs = min(e.max_num_seqs, budget)
    e.long_prefill_token_threshold = min(e.long_prefill_token_threshold, budget)
    return s


def _edge_prompt_tails(src: Source, s: Scenario) -> Scenario | None:
    changed = False
    for i, r in enumerate(s.requests):
        edge, is_async = src.int(0, 7), src.bool()
        if edge == 0:
            r.unique_len = 1  # the prompt's last token after its prefixes
        elif edge == 1 and s.prompt_len(i) > 1:
            r.external_tokens, r.external_async = s.prompt_len(i) - 1, is_async
        elif edge == 2:
            r.prefix_ids, r.unique_len, r.external_tokens = [], 1, 0  # a one-token prompt
            r.continues = r.continue_outputs = None
        else:
            continue
        changed = True
    return s if changed else None


def _edge_model_len(src: Source, s: Scenario) -> Scenario | None:
    k, on = _spec_tokens(s), src.int(0, 2) == 0
    slack = src.int(0, max(k, 1))
    if not (k and on):
        return None
    s.engine.max_model_len_slack = min(slack, k)
    return s


def _edge_block_size(src: Source, s: Scenario) -> Scenario | None:
    """cache_config.block_size below the mamba block, as EngineCore leaves it beside a finer
    prefix-cacheable group (engine.block_size_from_groups): V2's worker seeds a request's state
    column from cache_config, so its units matter only then. The attention group is made finer
    when it is not already."""
    e, on, finer = s.engine, src.int(0, 2) == 0, 1 << src.int(1, 3)
    if not on:
        return None
    if e.attn_block_size == e.mamba_block_size and e.mamba_block_size % finer == 0:
        e.attn_block_size = e.mamba_block_size // finer
    e.block_size_from_groups = e.attn_block_size < e.mamba_block_size
    return s if e.block_size_from_groups else None


_ROW_EDGE_EDITS = (_edge_geometry, _edge_spec, _edge_chunk_limit, _edge_budget, _edge_model_len, _edge_prompt_tails,
                   _edge_block_size)
