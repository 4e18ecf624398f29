import json

import pytest

from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario, ScenarioError, from_json, loads, validate
from tests.conftest import first_chunk_scenario


def test_round_trip_keeps_every_field():
    s = first_chunk_scenario()
    s.requests[0].abort_step = 9
    s.acceptance = [0, 1]
    again = loads(s.dumps())
    assert again == s
    assert again.prompt_tokens(1) == s.prompt_tokens(1)


def test_prompt_is_prefixes_then_tail():
    s = Scenario(prefixes=[5, 7], requests=[RequestSpec(prefix_ids=[0, 1], unique_len=3),
                                            RequestSpec(prefix_ids=[0], unique_len=2)])
    a, b = s.prompt_tokens(0), s.prompt_tokens(1)
    assert len(a) == 15 and len(b) == 7
    assert a[:5] == b[:5] and a[5:12] != b[5:7]


def test_equal_prompt_keys_mean_equal_prompts():
    """The harness caches each prompt's true states under `prompt_key`: a key must pin the prompt."""
    import random

    from mambafuzz.model.generate import random_scenario

    rng = random.Random(3)
    prompts: dict[tuple, list[int]] = {}
    pairs = 0
    for _ in range(300):
        s = random_scenario(random.Random(rng.getrandbits(32)))
        s.token_seed %= 3  # make keys collide across scenarios
        for i in range(len(s.requests)):
            if s.requests[i].continues is not None:  # built in a run, never cached under a key
                continue
            key, prompt = s.prompt_key(i), s.prompt_tokens(i)
            if key in prompts:
                pairs += 1
                assert prompts[key] == prompt, key
            prompts[key] = prompt
    assert pairs > 20
    t = Scenario(prefixes=[5, 6], requests=[RequestSpec(prefix_ids=[0], unique_len=3)])
    u = Scenario(prefixes=[5, 7], requests=[RequestSpec(prefix_ids=[1], unique_len=3)])
    assert t.prompt_key(0) != u.prompt_key(0) and t.prompt_tokens(0) != u.prompt_tokens(0)


def test_validation_reports_every_problem_at_once():
    s = Scenario(engine=EngineConfig(mamba_block_size=100, attn_block_size=16, spec_method="eagle3"),
                 requests=[RequestSpec(unique_len=0)])
    problems = validate(s)
    text = "\n".join(problems)
    assert "spec_method" in text
    s2 = Scenario(engine=EngineConfig(mamba_block_size=100, attn_block_size=16), requests=[])
    problems = validate(s2)
    assert any("multiple of 8" in p for p in problems)
    assert any("must divide mamba_block_size" in p for p in problems)
    assert any("requests must not be empty" in p for p in problems)
    assert all("\n" not in p for p in problems)


@pytest.mark.parametrize("mutate, needle", [
    (lambda s: setattr(s.engine, "prefix_match_unit", 7), "prefix_match_unit 7 must divide"),
    (lambda s: setattr(s.engine, "num_gpu_blocks", 3), "start-up minimum for the longest request"),
    (lambda s: setattr(s.requests[0], "external_tokens", 5000), "external_tokens 5000 must be below"),
    (lambda s: setattr(s.requests[0], "abort_step", -1), "abort_step must be"),
    (lambda s: setattr(s.requests[0], "prefix_ids", [3]), "prefix_ids must list indexes"),
    (lambda s: setattr(s.engine, "num_speculative_tokens", 0), "needs num_speculative_tokens"),
    (lambda s: setattr(s.engine, "prefix_cache_retention_interval", 100), "multiple of mamba_block_size"),
    (lambda s: setattr(s.engine, "max_num_batched_tokens", True), "must be an integer"),
])
def test_each_rule_names_its_field(mutate, needle):
    s = first_chunk_scenario()
    mutate(s)
    problems = validate(s)
    assert any(needle in p for p in problems), problems


def test_loader_rejects_unknown_fields_and_bad_json():
    raw = first_chunk_scenario().to_json()
    raw["engine"]["mamba_blok_size"] = 3
    raw["bogus"] = 1
    with pytest.raises(ScenarioError) as err:
        from_json(raw)
    assert "engine.mamba_blok_size is not a known field" in err.value.problems
    assert "top-level field 'bogus' is not known" in err.value.problems
    with pytest.raises(ScenarioError, match="not valid JSON"):
        loads("{")
    with pytest.raises(ScenarioError, match="version must be one of 1, 2"):
        loads(json.dumps({**first_chunk_scenario().to_json(), "version": 7}))
    with pytest.raises(ScenarioError, match="top level must be an object"):
        loads("[1, 2]")
