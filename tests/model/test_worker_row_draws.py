"""The conform target's second pass (mambafuzz.model.generate.draw_worker_rows): it draws the
dimensions vLLM's worker code branches on toward their edges, keeps every scenario valid, is
a function of its source, and leaves the scheduler target's inputs as they were."""

import random

from mambafuzz.model.generate import RandomSource, draw_worker_rows, random_scenario
from mambafuzz.model.scenario import validate

N = 400


def _pairs(seed0: int = 0):
    for seed in range(seed0, seed0 + N):
        rng = random.Random(seed)
        base = random_scenario(rng)
        if not validate(base):
            yield base, draw_worker_rows(RandomSource(rng), base)


def test_each_edge_is_drawn_and_every_revision_stays_valid():
    seen = {"spec added": 0, "chunk limit <= k+1": 0, "budget <= 3(k+1)": 0, "one-token tail": 0,
            "connector loads all but one": 0, "one-token prompt": 0, "block size from groups": 0}
    for base, s in _pairs():
        assert not validate(s)
        e, k = s.engine, s.engine.num_speculative_tokens if s.engine.uses_spec_decode else 0
        seen["spec added"] += bool(k and not base.engine.uses_spec_decode)
        seen["chunk limit <= k+1"] += bool(k and 0 < e.long_prefill_token_threshold <= k + 1)
        seen["budget <= 3(k+1)"] += e.max_num_batched_tokens <= 3 * (k + 1)
        seen["block size from groups"] += e.block_size_from_groups and e.attn_block_size < e.mamba_block_size
        for i, (r, old) in enumerate(zip(s.requests, base.requests, strict=True)):
            seen["one-token prompt"] += s.prompt_len(i) == 1 and base.prompt_len(i) != 1
            seen["one-token tail"] += r.unique_len == 1 and old.unique_len != 1 and s.prompt_len(i) > 1
            seen["connector loads all but one"] += (r.external_tokens == s.prompt_len(i) - 1 > 0
                                                    and old.external_tokens != r.external_tokens)
    assert all(n >= 5 for n in seen.values()), seen


def test_the_revision_is_a_function_of_its_source_and_leaves_the_input_alone():
    rng = random.Random(7)
    base = random_scenario(rng)
    before = base.dumps()
    state = rng.getstate()
    once = draw_worker_rows(RandomSource(rng), base).dumps()
    rng.setstate(state)
    assert draw_worker_rows(RandomSource(rng), base).dumps() == once
    assert base.dumps() == before


def test_the_scheduler_target_decodes_raw_inputs_as_before(tmp_path):
    """Only the conform target adds the pass: the same bytes give the scheduler target the plain
    scenario, and a scenario file runs as written on either target."""
    from mambafuzz.model.inputs import decode_input
    from mambafuzz.search.target_runtime import Runtime
    from mambafuzz.search.worker_protocol import WorkerConfig

    def runtime(target: str) -> Runtime:
        rt = Runtime.__new__(Runtime)  # decode needs the config only
        rt.config = WorkerConfig(target=target, split="fixed", findings=str(tmp_path), generator="random")
        return rt

    changed = 0
    for seed in range(60):
        data = random.Random(seed).randbytes(200)
        plain = decode_input(data)
        if plain is None:
            continue
        assert runtime("scheduler").decode(data).dumps() == plain.dumps()
        conform = runtime("conform").decode(data)
        changed += conform.dumps() != plain.dumps()
        as_file = plain.dumps().encode()
        assert runtime("conform").decode(as_file).dumps() == plain.dumps()
    assert changed > 0


def test_model_len_slack_sets_max_model_len_and_is_written_only_when_set():
    import dataclasses
    import json

    from mambafuzz.model.scenario import from_json

    s = next(base for base, _ in _pairs() if base.engine.uses_spec_decode)
    k = s.engine.num_speculative_tokens
    longest = s.max_model_len() - k - 1
    assert "max_model_len_slack" not in s.to_json()["engine"]
    tight = dataclasses.replace(s, engine=dataclasses.replace(s.engine, max_model_len_slack=0))
    assert tight.max_model_len() == longest and not validate(tight)
    again = from_json(json.loads(tight.dumps()))
    assert again.engine.max_model_len_slack == 0 and again.max_model_len() == longest
    bad = dataclasses.replace(s, engine=dataclasses.replace(s.engine, max_model_len_slack=-1))
    assert any("max_model_len_slack" in p for p in validate(bad))


def test_block_size_from_groups_is_written_only_when_set():
    import dataclasses
    import json

    from mambafuzz.model.scenario import engine_realism_notes, from_json

    s = next(base for base, _ in _pairs() if base.engine.attn_block_size < base.engine.mamba_block_size)
    assert "block_size_from_groups" not in s.to_json()["engine"]
    on = dataclasses.replace(s, engine=dataclasses.replace(s.engine, block_size_from_groups=True))
    assert from_json(json.loads(on.dumps())).engine.block_size_from_groups is True
    assert any("block_size_from_groups" in n for n in engine_realism_notes(on.engine))
    assert not any("block_size_from_groups" in n for n in engine_realism_notes(s.engine))
