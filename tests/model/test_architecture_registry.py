"""engine.model: the architecture registry, its validation, its JSON form, the generator's draw and the minimizer."""

import dataclasses
import json
import random

import pytest

from mambafuzz.model import architectures as arch
from mambafuzz.model import generate
from mambafuzz.model.scenario import (
    EngineConfig,
    RequestSpec,
    Scenario,
    ScenarioError,
    blocks_for_request,
    loads,
    validate,
)
from mambafuzz.search import minimizer


def _scenario(**engine) -> Scenario:
    return Scenario(engine=dataclasses.replace(EngineConfig(), **engine), requests=[RequestSpec(unique_len=40)])


def test_default_is_the_tiny_model_every_old_file_ran():
    assert EngineConfig().model == arch.DEFAULT_MODEL
    assert arch.get(arch.DEFAULT_MODEL).layout == "MMMA"  # mambafuzz/tiny_model/config.json layer_types


@pytest.mark.parametrize("name,mamba,attention,layers", [
    ("qwen3_next_80b", 36, 12, 48),  # num_hidden_layers 48, full_attention_interval 4
    ("qwen3_5_397b", 45, 15, 60),  # num_hidden_layers 60, full_attention_interval 4
    ("nemotron_h_8b", 24, 4, 28),  # hybrid_override_pattern: 24 M, 4 *, 24 - (no KV cache)
    ("granite_4_0_h_small", 36, 4, 40),  # layer_types: attention at 5, 15, 25, 35
    ("falcon_h1_7b", 44, 44, 44),  # attention and mamba side by side in every layer
])
def test_layouts_have_the_published_layer_counts(name, mamba, attention, layers):
    a = arch.get(name)
    assert (a.count(arch.MAMBA), a.count(arch.ATTENTION), len(a.layout)) == (mamba, attention, layers)


def test_an_unknown_model_is_a_one_line_error():
    with pytest.raises(arch.UnknownModel, match="unknown model 'mamba9'"):
        arch.get("mamba9")
    with pytest.raises(ScenarioError) as exc:
        loads(json.dumps({**_scenario().to_json(), "engine": {"model": "mamba9"}}))
    (line,) = exc.value.problems
    assert line.startswith("engine.model must be one of tiny_qwen3_next") and "'mamba9'" in line and "\n" not in line


def test_old_files_load_on_the_default_and_the_default_is_not_written():
    raw = _scenario().to_json()
    assert "model" not in raw["engine"]
    assert loads(json.dumps(raw)).engine.model == arch.DEFAULT_MODEL
    other = _scenario(model="nemotron_h_8b")
    assert other.to_json()["engine"]["model"] == "nemotron_h_8b"
    assert loads(other.dumps()).engine.model == "nemotron_h_8b"


def test_mtp_needs_a_model_with_drafter_layers():
    assert any("needs a model with MTP layers" in p
               for p in validate(_scenario(model="nemotron_h_8b", spec_method="mtp", num_speculative_tokens=1)))
    assert not validate(_scenario(model="qwen3_next_80b", spec_method="mtp", num_speculative_tokens=1))


def test_prefill_checkpoints_need_a_mamba2_model():
    kw = dict(num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)
    assert any("needs a Mamba2 model" in p for p in validate(_scenario(model="qwen3_next_80b", **kw)))
    assert not validate(_scenario(model="nemotron_h_8b", **kw))
    assert not validate(_scenario(**kw))  # the default keeps what it always accepted


def test_mixer_follows_the_architecture():
    assert _scenario(model="falcon_h1_7b").engine.mixer == "mamba2"
    assert _scenario(model="qwen3_next_80b").engine.mixer == "gdn"
    assert _scenario().engine.mixer == "gdn"


def test_pool_sizing_counts_the_models_mamba_groups():
    base = blocks_for_request(EngineConfig(), 1000)
    assert blocks_for_request(EngineConfig(model="granite_4_0_h_small"), 1000) > base
    assert blocks_for_request(EngineConfig(model="falcon_h1_7b"), 1000) < base


def test_model_is_the_generators_last_draw(monkeypatch):
    """Every field but the model decodes as it did before the knob: the draw comes after all others
    but the ones added since (generate.LATE_DRAWS), left out of both runs here."""
    with generate.late_draws_left_out("_draw_continuations"):
        drawn = [generate.random_scenario(random.Random(seed)) for seed in range(60)]
        assert {s.engine.model for s in drawn} - {arch.DEFAULT_MODEL}, "the generator never draws another model"
        monkeypatch.setattr(generate, "draw_model", lambda src, scenario: arch.DEFAULT_MODEL)
        for seed, s in enumerate(drawn):
            s.engine.model = arch.DEFAULT_MODEL
            assert s == generate.random_scenario(random.Random(seed))


def test_drawn_models_suit_the_config():
    for seed in range(200):
        s = generate.random_scenario(random.Random(seed))
        assert not validate(s), (seed, validate(s))


def test_minimizer_moves_the_model_to_the_default():
    s = _scenario(model="nemotron_h_8b")
    assert any(c.engine.model == arch.DEFAULT_MODEL and c.engine == dataclasses.replace(s.engine, model=arch.DEFAULT_MODEL)
               for c in minimizer._simplify_engine(s))


def test_a_block_below_vllms_block_size_for_the_model_is_a_realism_note():
    from mambafuzz.model.scenario import engine_realism_notes

    assert any("vLLM raises the block size of nemotron_h_8b to at least 528" in n
               for n in engine_realism_notes(EngineConfig(model="nemotron_h_8b", mamba_block_size=256, attn_block_size=256)))
    assert not engine_realism_notes(EngineConfig(model="nemotron_h_8b", mamba_block_size=528, attn_block_size=528))
    assert not engine_realism_notes(EngineConfig(mamba_block_size=256, attn_block_size=256))
