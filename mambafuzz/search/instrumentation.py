"""Which code gives the atheris/hypothesis generators their coverage feedback, and how only
that code gets instrumented.

atheris' `instrument_imports(include=[...])` keeps only the top-level package of each name
(`module_name.split(".")[0]` in atheris/import_hook.py), so `include=["vllm.v1.core"]`
instruments every vLLM module imported inside the block (config, entrypoints, multimodal,
logging, ...), with dataflow tracing, and `"mambafuzz.model.generate"` instruments all of `mambafuzz`,
oracle and kernel model included.  That feedback rewards paths in our own checker and in
vLLM's configuration code, and it costs time on every call into them.

Instead, everything is imported uninstrumented first; then each Python function whose
`__module__` lies under one of its target's `coverage_modules` (mambafuzz.search.fuzz_targets) gets atheris' instrumentation on its code
object (`atheris.instrument_func`; nested functions and lambdas are patched with it).
"""

from __future__ import annotations

import gc
import importlib
import types
from collections.abc import Iterable

# What each target instruments is its registration's `coverage_modules` (mambafuzz.search.fuzz_targets).


def under(module: str, prefixes: Iterable[str]) -> bool:
    """Whether `module` is one of `prefixes` or a submodule of one ("vllm.v1.core.x", not "vllm.v1.corex")."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def functions_under(prefixes: Iterable[str]) -> list[types.FunctionType]:
    """Every loaded Python function defined in a module under `prefixes`."""
    prefixes = tuple(prefixes)
    return [obj for obj in gc.get_objects()
            if isinstance(obj, types.FunctionType) and isinstance(getattr(obj, "__module__", None), str)
            and under(obj.__module__, prefixes)]


def instrument_target(target: str) -> int:
    """Import the coverage modules of `target` (its registration's `coverage_modules`) that are
    plain `mambafuzz` modules, then instrument everything loaded under them; returns how many functions."""
    from mambafuzz.search import fuzz_targets

    prefixes = fuzz_targets.get(target).coverage_modules
    for name in prefixes:
        if name.startswith("mambafuzz."):
            importlib.import_module(name)
    return instrument_modules(prefixes)


def instrument_modules(prefixes: Iterable[str]) -> int:
    """Instrument the functions of the loaded modules under `prefixes`; returns how many."""
    import atheris

    funcs = functions_under(prefixes)
    for func in funcs:
        atheris.instrument_func(func)
    return len(funcs)
