"""The generator's decode pressure (mambafuzz.model.generate `_draw_decode_pressure`): decodes that
outgrow a pool sized to what the requests hold at their ends, drawn last, in multi-request
scenarios only, through fields the input model already has."""

from __future__ import annotations

import dataclasses

from mambafuzz.model import generate
from mambafuzz.model.scenario import min_pool_blocks, validate
from tests.conftest import drawn_with_and_without

ENGINE_FIELDS = {"num_gpu_blocks", "max_num_seqs"}
REQUEST_FIELDS = {"max_tokens", "arrival_step"}


def _with_and_without(seeds):
    return drawn_with_and_without("_draw_decode_pressure", seeds)


def test_the_pressure_is_a_late_draw_and_revises_only_its_fields_in_multi_request_scenarios():
    assert "_draw_decode_pressure" in generate.LATE_DRAWS
    drawn, before = _with_and_without(range(600))
    fired = 0
    for s, b in zip(drawn, before):
        assert not validate(s)
        if s == b:
            continue
        fired += 1
        assert len(b.requests) >= 2, "pressure on a lone request"
        changed = {f.name for f in dataclasses.fields(s.engine) if getattr(s.engine, f.name) != getattr(b.engine, f.name)}
        assert changed <= ENGINE_FIELDS, changed
        for r, q in zip(s.requests, b.requests, strict=True):
            changed = {f.name for f in dataclasses.fields(r) if getattr(r, f.name) != getattr(q, f.name)}
            assert changed <= REQUEST_FIELDS, changed
            assert r.max_tokens >= q.max_tokens and r.arrival_step <= q.arrival_step
            assert r.max_tokens == q.max_tokens or r.max_tokens <= generate.MAX_PRESSURE_OUTPUT_TOKENS
        assert (s.prefixes, s.acceptance, s.token_seed) == (b.prefixes, b.acceptance, b.token_seed)
        if s.engine.num_gpu_blocks != b.engine.num_gpu_blocks:
            assert min_pool_blocks(s) <= s.engine.num_gpu_blocks <= 4096
    several = sum(len(b.requests) >= 2 for b in before)
    assert several * 0.08 <= fired <= several * 0.3, (fired, several)


def test_the_pressure_makes_preemptions_of_requests_that_sampled_common():
    """Among the scenarios the draw changes, more runs preempt a request that had already sampled
    (the dimension bench/pair_coverage.py measured at 1.1% of executions before the draw)."""
    from mambafuzz.search.state_coverage import event_dimensions
    from mambafuzz.sim.engine import harness

    drawn, before = _with_and_without(range(400))
    pairs = [(s, b) for s, b in zip(drawn, before) if s != b]

    def preempts_after_output(s):
        return "event:preempted-with-output" in event_dimensions(s, harness.run(s))

    with_draw = sum(preempts_after_output(s) for s, _ in pairs)
    without = sum(preempts_after_output(b) for _, b in pairs)
    assert with_draw >= without + 3, (with_draw, without, len(pairs))
