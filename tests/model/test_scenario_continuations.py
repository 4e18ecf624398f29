"""Continuations (RequestSpec.continues / continue_outputs): validation, lengths, JSON, the step
plan's arrivals, the generator's chains and the minimizer's passes. No vLLM here."""

import json
import random
from pathlib import Path

import pytest

from mambafuzz.model import scenario as sc
from mambafuzz.model.generate import random_scenario
from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario, ScenarioError, validate
from mambafuzz.model.step_plan import DONE, StepPlan
from mambafuzz.search import minimizer
from tests.conftest import drawn_with_and_without

ROOT = Path(__file__).resolve().parents[2]


def chain() -> Scenario:
    return Scenario(EngineConfig(mamba_block_size=64, attn_block_size=64), requests=[
        RequestSpec(0, [], 100, 60),
        RequestSpec(0, [], 20, 8, continues=0),
        RequestSpec(3, [], 0, 4, continues=1, continue_outputs=3),
    ], token_seed=1)


def test_a_continuation_must_name_an_earlier_request():
    s = chain()
    s.requests[1].continues = 1
    assert validate(s) == ["requests[1].continues must name an earlier request (0..0), got 1"]
    s.requests[1].continues = 2  # a later one: a cycle would be possible
    assert validate(s) == ["requests[1].continues must name an earlier request (0..0), got 2"]
    s = chain()
    s.requests[0].continues = 0
    s.requests[0].unique_len = 1
    assert validate(s) == ["requests[0].continues must name an earlier request, and requests[0] has none"]
    s = chain()
    s.requests[1].continues = -1
    assert validate(s) == ["requests[1].continues must be >= 0, got -1"]
    s.requests[1].continues = True
    assert validate(s) == ["requests[1].continues must be an integer, got True"]


def test_continue_outputs_needs_a_link_and_an_ordinary_request_keeps_a_tail():
    s = chain()
    s.requests[0].continue_outputs = 2
    assert validate(s) == ["requests[0].continue_outputs needs continues"]
    s = chain()
    s.requests[2].continue_outputs = -1
    assert validate(s) == [f"requests[2].continue_outputs must be in [0, {sc.MAX_OUTPUT_TOKENS}], got -1"]
    s = chain()
    assert not validate(s)  # requests[2] has unique_len 0: a continuation may add nothing
    s.requests[2].continues = None
    s.requests[2].continue_outputs = None
    assert validate(s) == [f"requests[2].unique_len must be in [1, {sc.MAX_PROMPT_TOKENS}], got 0"]


def test_lengths_bound_what_a_run_can_build():
    s = chain()
    assert s.prompt_len(1) == 100 + 60 + 20 and s.min_prompt_len(1) == 100 + 20
    assert s.prompt_len(2) == 180 + 3 and s.min_prompt_len(2) == 120
    s.requests[2].continue_outputs = 100  # more than r1 can generate: r1's max_tokens bounds it
    assert s.prompt_len(2) == 180 + 8
    assert s.max_model_len() >= 188 + 4
    s.requests[1].external_tokens = 120  # a connector claim must fit the shortest prompt
    assert validate(s) == ["requests[1].external_tokens 120 must be below its prompt length 120"]
    s = chain()
    s.requests[0].unique_len = 8150  # the longest chain prompt is judged against the cap
    assert any("requests[1] prompt is 8230 tokens" in p for p in validate(s))


def test_the_prompt_is_the_earlier_prompt_its_outputs_then_the_new_tail():
    s = chain()
    with pytest.raises(ScenarioError, match=r"requests\[1\] continues r0: its prompt depends on what r0 generates"):
        s.prompt_tokens(1)
    earlier = s.prompt_tokens(0) + [7, 8, 9]  # r0 ended after generating 3 tokens
    prompt, n = s.continuation_prompt(1, earlier, 100)
    assert n == 3 and prompt == earlier + s.tail_tokens(1) and len(prompt) == 123
    prompt, n = s.continuation_prompt(2, earlier + [5] * 10, 103)  # takes 3 of the 10
    assert n == 3 and prompt == earlier + [5, 5, 5] and s.tail_tokens(2) == []
    prompt, n = s.continuation_prompt(2, earlier, 103)  # generated nothing: fewer than asked
    assert n == 0 and prompt == earlier
    assert s.static_prompts() == [s.prompt_tokens(0), None, None]


def test_json_round_trips_and_old_files_load_and_dump_unchanged():
    s = chain()
    back = sc.loads(s.dumps())
    assert back == s
    text = (ROOT / "corpus" / "seeds" / "aborts_prefill_and_decode.json").read_text()
    old = sc.loads(text)
    assert all(r.continues is None and r.continue_outputs is None for r in old.requests)
    dumped = json.loads(old.dumps())["requests"]
    assert all("continues" not in r and "continue_outputs" not in r for r in dumped)
    with pytest.raises(ScenarioError, match=r"continues must name an earlier request"):
        raw = s.to_json()
        raw["requests"][1]["continues"] = 5
        sc.from_json(raw)


def test_a_continuation_arrives_once_its_request_ended_and_not_before_its_step():
    plan = StepPlan.of(chain())
    assert plan.arrivals(0) == [(0, "r0")] and set(plan.pending) == {1, 2}
    ended: set[str] = set()
    assert plan.continuations(0, ended.__contains__) == []
    assert plan.end(5, has_unfinished=False) is None  # continuations pending: not done
    ended.add("r0")
    assert plan.continuations(1, ended.__contains__) == [(1, 0, "r1")]
    ended.add("r1")
    assert plan.continuations(2, ended.__contains__) == []  # r2 is due at step 3
    assert plan.continuations(3, ended.__contains__) == [(2, 1, "r2")]
    assert plan.continuations(4, ended.__contains__) == [] and not plan.pending
    assert plan.end(4, has_unfinished=False) == DONE


def test_the_generator_draws_chains_and_retries_and_keeps_every_other_draw():
    links = retries = longest = 0
    for seed in range(300):
        s = random_scenario(random.Random(seed))
        assert not validate(s), (seed, validate(s))
        links += sum(r.continues is not None for r in s.requests)
        retries += sum(r.continue_outputs == 0 and s.requests[r.continues].abort_step is not None
                       for r in s.requests if r.continues is not None)
        depth = {}
        for i, r in enumerate(s.requests):
            depth[i] = depth[r.continues] + 1 if r.continues is not None else 0
        longest = max(longest, max(depth.values()))
    assert links > 60 and retries > 5 and longest >= 2


def test_the_links_are_drawn_last():
    """Unlinking a generated scenario gives exactly the scenario the same input gave before."""

    drawn, unlinked = drawn_with_and_without("_draw_continuations", range(60))  # later draws left out of both
    for seed, (s, before) in enumerate(zip(drawn, unlinked)):
        for r in s.requests:
            r.continues = r.continue_outputs = None
        assert s == before, seed


def test_the_minimizer_drops_links_splices_chains_and_shrinks_outputs():
    s = chain()
    s.requests[2].continue_outputs = 8
    dropped = list(minimizer._drop_requests(s))
    # dropping r1 makes r2 continue r0 (what r1 continued); dropping r0 unlinks r1
    without_r1 = dropped[1]
    assert [r.continues for r in without_r1.requests] == [None, 0]
    without_r0 = dropped[2]
    assert [r.continues for r in without_r0.requests] == [None, 0]
    assert without_r0.requests[0].unique_len == 20 and not validate(without_r0)
    unlinked = list(minimizer._drop_links(s))
    assert [[r.continues for r in c.requests] for c in unlinked] == [[None, None, 1], [None, 0, None]]
    assert unlinked[1].requests[2].unique_len == 1 and not validate(unlinked[1])
    assert all(minimizer.complexity(c) < minimizer.complexity(s) for c in unlinked)
    shrunk = [c.requests[2].continue_outputs for c in minimizer._shrink_numbers(s)
              if c.requests[2].continue_outputs != 8]
    assert shrunk[0] == 0
    tails = [c.requests[2].unique_len for c in minimizer._shrink_numbers(chain()) if c.requests[2].unique_len]
    assert tails == []  # already 0, which a continuation may have
