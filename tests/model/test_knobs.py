"""Each engine knob is declared once (mambafuzz.model.scenario.Knob); validation, the generator, the
minimizer, the config cache key and the prefix-caching-off twin follow the declaration.  These
tests walk every declared knob, so a new one is checked without a new test."""

import dataclasses
import random

import pytest

from mambafuzz.model import generate
from mambafuzz.model.scenario import KEEP, EngineConfig, Knob, RequestSpec, Scenario, knobs, validate
from mambafuzz.search import minimizer
from mambafuzz.sim.bridge.configs import engine_key

KNOBS = knobs()


def _other_value(k: Knob, current):
    """A valid value of `k` other than `current`."""
    if k.kind == "bool":
        return not current
    if k.kind == "choice":
        return next(c for c in k.choices if c != current)
    return (current or k.lo) + 4


def _scenario(**engine) -> Scenario:
    return Scenario(engine=dataclasses.replace(EngineConfig(), **engine), requests=[RequestSpec(unique_len=40)])


@pytest.mark.parametrize("name", [n for n, k in KNOBS.items() if k.kind == "int"])
def test_validation_enforces_each_int_knobs_declared_range(name):
    k = KNOBS[name]
    assert any(f"engine.{name} must be" in p for p in validate(_scenario(**{name: k.lo - 1})))
    if k.hi is not None:
        assert any(f"engine.{name} must be" in p for p in validate(_scenario(**{name: k.hi + 1})))
    assert any(f"engine.{name} must be an integer" in p for p in validate(_scenario(**{name: "7"})))
    none_problems = validate(_scenario(**{name: None}))
    assert any(f"engine.{name}" in p for p in none_problems) != k.optional


@pytest.mark.parametrize("name", [n for n, k in KNOBS.items() if k.kind != "int"])
def test_validation_enforces_each_switch_and_choice(name):
    problems = validate(_scenario(**{name: 3}))
    assert any(f"engine.{name} must be" in p for p in problems), problems


def test_the_config_cache_key_covers_exactly_the_build_knobs():
    base = EngineConfig()
    for name, k in KNOBS.items():
        changed = dataclasses.replace(base, **{name: _other_value(k, getattr(base, name))})
        assert (engine_key(changed, 100) != engine_key(base, 100)) == k.build_key, name


def test_the_uncached_twin_takes_each_declared_uncached_value():
    e = EngineConfig(prefix_match_unit=8, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=8,
                     enable_mamba_shared_prefix_checkpoint=True, max_num_seqs=3)
    twin = e.without_prefix_caching()
    assert twin.enable_prefix_caching is False and twin.max_num_seqs == 3
    declared = {n for n, k in KNOBS.items() if k.uncached is not KEEP}
    assert declared >= {"prefix_match_unit", "num_prefill_checkpoint_blocks", "prefill_checkpoint_alignment",
                        "enable_mamba_shared_prefix_checkpoint", "enable_prefix_caching"}
    for name in declared:
        assert getattr(twin, name) == KNOBS[name].uncached, name


@pytest.mark.parametrize("name", [n for n, k in KNOBS.items() if k.simplest is not None or k.optional])
def test_the_minimizer_proposes_each_knobs_simplest_value(name):
    k = KNOBS[name]
    value = _other_value(k, k.simplest)
    if k.kind == "int" and not k.shrink and not k.optional:
        pytest.skip(f"{name} has a shrink pass of its own")
    s = _scenario(**{name: value})
    proposed = [c for make in minimizer.PASSES for c in make(s)]
    hits = [c for c in proposed if getattr(c.engine, name) == k.simplest]
    assert hits, f"no candidate sets {name} to {k.simplest!r}"
    for other, other_value in k.companions:
        assert all(getattr(c.engine, other) == other_value for c in hits), (name, other)


def test_the_generator_draws_every_knob_either_by_hand_or_from_its_declaration():
    assert generate.DRAWN_HERE <= set(KNOBS)
    rng = random.Random(5)
    spec = Knob(kind="int", lo=2, hi=9, optional=True, simplest=2)
    values = {generate.draw_knob(generate.RandomSource(rng), spec) for _ in range(400)}
    assert None in values and 2 in values and values - {None} <= set(range(2, 10)) and len(values) > 4
    assert {generate.draw_knob(generate.RandomSource(rng), Knob(kind="choice", choices=("a", "b")))
            for _ in range(50)} == {"a", "b"}
