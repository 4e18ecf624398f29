"""The config is built past the CPU platform's Triton gate (vLLM 0.34, platforms/cpu.py:243) only
when that check itself refused, with the flag true only while the check runs; a release whose
check passes builds once, untouched. Fakes stand in for vLLM (CI has no 0.34 tree)."""

from __future__ import annotations

import types

import pytest

from mambafuzz.sim.bridge.vllm_compat import features, platform_gate
from mambafuzz.sim.bridge.vllm_compat.output import resumed_req_ids


def _fake(refuse: bool):
    """A fake `vllm.triton_utils` and a platform class; its check refuses (as 0.34's does) when asked."""
    tu = types.ModuleType("fake_triton_utils")
    tu.HAS_TRITON = False
    seen: list[bool] = []

    class Platform:
        @classmethod
        def check_and_update_config(cls, vllm_config):
            seen.append(tu.HAS_TRITON)
            if refuse and not tu.HAS_TRITON:
                raise RuntimeError("vLLM on x86 CPUs requires Triton (triton-cpu).")

    # the traceback check wants the check to live under a `platforms/` directory, as vLLM's does
    code = Platform.__dict__["check_and_update_config"].__func__.__code__
    Platform.__dict__["check_and_update_config"].__func__.__code__ = code.replace(
        co_filename="/x/vllm/platforms/cpu.py")
    return tu, Platform, seen


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(platform_gate, "_gated", [False])


def test_a_passing_check_builds_once_without_the_stand_in():
    tu, platform, seen = _fake(refuse=False)
    made = platform_gate.build_past_triton_gate(lambda: platform.check_and_update_config(None) or "vc", platform, tu)
    assert made == "vc" and seen == [False]


def test_the_gate_is_passed_with_the_flag_true_only_during_the_check():
    tu, platform, seen = _fake(refuse=True)
    original = platform.__dict__["check_and_update_config"]
    made = platform_gate.build_past_triton_gate(lambda: platform.check_and_update_config(None) or "vc", platform, tu)
    assert made == "vc" and seen == [False, True]
    assert tu.HAS_TRITON is False and platform.__dict__["check_and_update_config"] is original
    # later builds go straight to the stand-in
    platform_gate.build_past_triton_gate(lambda: platform.check_and_update_config(None), platform, tu)
    assert seen == [False, True, True]


def test_another_refusal_is_not_taken_for_the_gate():
    tu, platform, _ = _fake(refuse=False)

    def make():
        raise RuntimeError("vLLM on x86 CPUs requires Triton (triton-cpu).")  # not raised by the check itself

    with pytest.raises(RuntimeError):
        platform_gate.build_past_triton_gate(make, platform, tu)
    assert platform_gate._gated == [False]


def test_the_gate_is_not_assumed_when_vllm_has_triton():
    tu, platform, _ = _fake(refuse=True)
    try:
        platform.check_and_update_config(None)
    except RuntimeError as exc:
        tu.HAS_TRITON = True
        assert not platform_gate.refused_by_triton_gate(exc, tu)
        tu.HAS_TRITON = False
        assert platform_gate.refused_by_triton_gate(exc, tu)


def test_runner_choice_is_read_from_the_config_class():
    class Old:
        @property
        def use_v2_model_runner(self) -> bool:
            return True

    class New:  # vLLM 0.34: Model Runner V2 only
        pass

    assert features.has_runner_choice(Old) and not features.has_runner_choice(New)


def test_resumed_requests_without_the_field_are_none():
    cached = types.SimpleNamespace(resumed_req_ids={"a"})
    assert resumed_req_ids(types.SimpleNamespace(scheduled_cached_reqs=cached)) == {"a"}
    gone = types.SimpleNamespace(req_ids=[])  # vLLM 0.34's CachedRequestData
    assert resumed_req_ids(types.SimpleNamespace(scheduled_cached_reqs=gone)) == set()


def test_an_installed_gate_retries_only_a_refused_check_and_restores_the_flag():
    tu, platform, seen = _fake(refuse=True)
    platform_gate.pass_gate_on_refusal(platform, tu)
    platform_gate.pass_gate_on_refusal(platform, tu)  # a second install wraps once
    platform.check_and_update_config(None)
    assert seen == [False, True] and tu.HAS_TRITON is False
    tu2, passing, seen2 = _fake(refuse=False)
    platform_gate.pass_gate_on_refusal(passing, tu2)
    passing.check_and_update_config(None)
    assert seen2 == [False]  # a check that passes runs once, flag untouched


def test_an_installed_gate_lets_a_refusal_the_flag_does_not_lift_through():
    tu, platform, _ = _fake(refuse=False)
    original = platform.__dict__["check_and_update_config"].__func__

    def other(cls, vllm_config):
        original(cls, vllm_config)
        raise RuntimeError("some other refusal")

    other.__code__ = other.__code__.replace(co_filename="/x/vllm/platforms/cpu.py", co_name="check_and_update_config")
    platform.check_and_update_config = classmethod(other)
    platform_gate.pass_gate_on_refusal(platform, tu)
    with pytest.raises(RuntimeError, match="some other refusal"):
        platform.check_and_update_config(None)
