"""The generator's load burst (mambafuzz.model.generate `_draw_load_burst`): a P/D decode
instance's concurrent async loads on a pool they fill, drawn last, only where requests load
asynchronously, and only through fields the input model already has."""

from __future__ import annotations

import dataclasses

from mambafuzz.model.scenario import validate
from tests.conftest import drawn_with_and_without

# the fields the burst may revise; everything else is as the earlier draws left it
ENGINE_FIELDS = {"num_gpu_blocks", "max_num_seqs"}
REQUEST_FIELDS = {"arrival_step", "external_tokens", "external_async", "unique_len"}


def _with_and_without(seeds):
    return drawn_with_and_without("_draw_load_burst", seeds)


def _async_loads(s):
    return [r for r in s.requests if r.external_tokens and r.external_async]


def test_the_burst_is_drawn_last_and_revises_only_its_fields_where_requests_load_asynchronously():
    drawn, before = _with_and_without(range(400))
    fired = 0
    for s, b in zip(drawn, before):
        assert not validate(s)
        if s == b:
            continue
        fired += 1
        assert _async_loads(b), "a burst where nothing loaded asynchronously"
        changed = {f.name for f in dataclasses.fields(s.engine) if getattr(s.engine, f.name) != getattr(b.engine, f.name)}
        assert changed <= ENGINE_FIELDS, changed
        assert len(s.requests) == len(b.requests)
        for r, q in zip(s.requests, b.requests):
            changed = {f.name for f in dataclasses.fields(r) if getattr(r, f.name) != getattr(q, f.name)}
            assert changed <= REQUEST_FIELDS, changed
        assert (s.prefixes, s.acceptance, s.token_seed) == (b.prefixes, b.acceptance, b.token_seed)
    with_loads = sum(bool(_async_loads(b)) for b in before)
    assert with_loads * 0.25 <= fired <= with_loads * 0.7, (fired, with_loads)


def test_the_burst_parks_whole_prompt_loads_together():
    """Several async loads of whole prompts (but one token) that arrive in one step, under spec
    decoding, become common: the dimensions the async-load + MTP deadlock needs together
    (vllm-project/vllm#57104; bench/spec_async_cooccurrence.py measures them over 2,000 seeds)."""
    drawn, before = _with_and_without(range(2000))

    def parked(s):
        loads = _async_loads(s)
        return (s.engine.uses_spec_decode and len(loads) >= 2 and len({r.arrival_step for r in loads}) == 1
                and all(r.external_tokens == s.prompt_len(s.requests.index(r)) - 1 for r in loads))
    assert sum(map(parked, before)) <= 5
    assert sum(map(parked, drawn)) >= 40


def test_a_generated_burst_shows_the_planted_async_load_spec_deadlock():
    """Seed 1310 of the random generator draws two 128-token prompts loaded whole but one token,
    arriving together under MTP on a 17-block pool (Qwen3-Next-80B's layout): the planted deadlock
    stalls it and vLLM 0.32.0 runs it clean. With the burst left out the same seed draws neither
    the loads' lengths nor the pool, and stays clean with the planted bug (its kill is not confirmed)."""
    from mambafuzz.tools.mutation import kills

    drawn, before = _with_and_without([1310])
    ok, why = kills.confirms_kill(drawn[0], "fixed", "deadlock_async_load_spec_slots_both", signature="stall:step-bound")
    assert ok, why
    ok, why = kills.confirms_kill(before[0], "fixed", "deadlock_async_load_spec_slots_both")
    assert not ok, why


def test_leaving_late_draws_out_covers_every_source_and_restores_them():
    """generate.late_draws_left_out: inside, the draw and every one after it draw nothing, for a seed
    and for bytes alike (the decoders share draw_scenario); outside, the generator is whole again."""
    import random

    from mambafuzz.model import generate

    seeds = range(200)
    whole = [generate.random_scenario(random.Random(seed)) for seed in seeds]
    raw = [random.Random(seed).randbytes(96) for seed in seeds]
    whole_raw = [generate.scenario_from_bytes(data) for data in raw]
    with generate.late_draws_left_out("_draw_load_burst"):
        assert all(getattr(generate, name) is generate._no_draw for name in generate.draws_from("_draw_load_burst"))
        cut = [generate.random_scenario(random.Random(seed)) for seed in seeds]
        cut_raw = [generate.scenario_from_bytes(data) for data in raw]
    assert cut != whole and cut_raw != whole_raw
    assert whole == [generate.random_scenario(random.Random(seed)) for seed in seeds]
    assert whole_raw == [generate.scenario_from_bytes(data) for data in raw]
    with generate.late_draws_left_out(None):
        assert whole == [generate.random_scenario(random.Random(seed)) for seed in seeds]
