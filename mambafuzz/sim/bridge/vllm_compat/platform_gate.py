"""Building a VllmConfig for the scheduler harness past the CPU platform's Triton gate.

vLLM 0.34's `CpuPlatform.check_and_update_config` (vllm/platforms/cpu.py:242-243) refuses an
x86 host without triton-cpu ("vLLM on x86 CPUs requires Triton (triton-cpu).") because its CPU
model runner launches Triton kernels. The scheduler harness builds the config only to drive the
Scheduler and KVCacheManager; it never runs a kernel. So, and only when the platform check itself
refused for that reason, the config is built again with `vllm.triton_utils.HAS_TRITON` reading
True for the duration of that one check (nothing else in it reads the flag on x86:
`uses_standalone_cpu_model_runner`, cpu.py:652-656, is False on x86 either way). A release whose
check passes (0.32, 0.33) builds exactly as before: the stand-in is never entered.

What leaks: a vLLM module first imported during that check binds `HAS_TRITON` as True (on 0.34:
the model-class import `_cpu_mamba_backend` tries, cpu.py:71, which fails on the placeholder
Triton anyway). No scheduler-level code calls those modules; the conformance tier, which does run
kernels, is not supported on 0.34 (docs/VLLM_VERSIONS.md).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from pathlib import PurePath
from types import ModuleType, TracebackType
from typing import TypeVar

T = TypeVar("T")
CHECK = "check_and_update_config"

# Set once a build was refused by the gate: later builds in this process go straight to the stand-in.
_gated: list[bool] = [False]


def refused_by_triton_gate(exc: BaseException, triton_utils: ModuleType) -> bool:
    """Whether `exc` is the CPU platform's own refusal for want of Triton: a RuntimeError raised in
    the body of a platform's `check_and_update_config` (its innermost frame, so not something that
    check called) under vllm/platforms/, while vLLM's Triton flag is off."""
    if not isinstance(exc, RuntimeError) or getattr(triton_utils, "HAS_TRITON", True):
        return False
    tb: TracebackType | None = exc.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return False
    code = last.tb_frame.f_code
    return code.co_name == CHECK and PurePath(code.co_filename).parent.name == "platforms"


@contextlib.contextmanager
def triton_stand_in(platform_cls: type, triton_utils: ModuleType) -> Iterator[None]:
    """While inside: `platform_cls.check_and_update_config` runs with `triton_utils.HAS_TRITON`
    True, and only while it runs. Both are restored on the way out."""
    own = CHECK in platform_cls.__dict__
    original = inspect.getattr_static(platform_cls, CHECK)
    func = original.__func__ if isinstance(original, classmethod) else original

    def check(cls: type, vllm_config: object) -> None:
        before = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            func(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = before

    setattr(platform_cls, CHECK, classmethod(check))
    try:
        yield
    finally:
        if own:
            setattr(platform_cls, CHECK, original)
        else:
            delattr(platform_cls, CHECK)


def build_past_triton_gate(make: Callable[[], T], platform_cls: type, triton_utils: ModuleType) -> T:
    """`make()` (a VllmConfig constructor call); if the platform's Triton gate refuses it, `make()`
    again under `triton_stand_in` (scheduler-level use only: nothing built here runs a kernel).
    Any other failure propagates unchanged."""
    if not _gated[0]:
        try:
            return make()
        except RuntimeError as exc:
            if not refused_by_triton_gate(exc, triton_utils):
                raise
        _gated[0] = True
    with triton_stand_in(platform_cls, triton_utils):
        return make()


def pass_gate_on_refusal(platform_cls: type, triton_utils: ModuleType) -> None:
    """Make every later `platform_cls.check_and_update_config` call pass the Triton gate the way
    `build_past_triton_gate` passes one build: the check runs as it is, and only when it refuses for
    want of Triton does it run again with the flag True for that one call. For code that builds its
    own configs (vLLM's test helpers in an exported test: mambafuzz.upstream.cpu_gate_plugin).
    Installing it twice wraps once."""
    current = platform_cls.__dict__.get(CHECK)
    if not isinstance(current, classmethod) or getattr(current.__func__, "_past_triton_gate", False):
        return
    original = current.__func__

    def past_gate(cls: type, vllm_config: object) -> None:
        try:
            return original(cls, vllm_config)
        except RuntimeError as exc:
            if not refused_by_triton_gate(exc, triton_utils):
                raise
        before = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            return original(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = before

    past_gate._past_triton_gate = True  # type: ignore[attr-defined]
    setattr(platform_cls, CHECK, classmethod(past_gate))


def pass_cpu_gate_on_refusal() -> None:
    """`pass_gate_on_refusal` for the installed vLLM's CPU platform (mambafuzz.upstream.cpu_gate_plugin)."""
    import vllm.triton_utils as triton_utils
    from vllm.platforms.cpu import CpuPlatform

    pass_gate_on_refusal(CpuPlatform, triton_utils)
