"""Finding a vLLM name in the installed release: the first of its places that exists wins.
The importer is a parameter so tests can stand in fake vLLM modules."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from mambafuzz.sim.bridge.vllm_compat import VllmUnsupported
from mambafuzz.sim.bridge.vllm_compat.symbols import ENGINE_TIER, MODEL_CLASSES, OPTIONAL, SYMBOLS, Place

Importer = Callable[[str], ModuleType]


class Missing:
    """Stands in for an optional name this vLLM lacks: importing it works, calling it says
    what is missing (callers gate on `features` first, so a call means a gate was forgotten)."""

    def __init__(self, name: str, why: str) -> None:
        self.name, self.why = name, why

    def __bool__(self) -> bool:
        return False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise VllmUnsupported(self.why)

    def __repr__(self) -> str:
        return f"<missing vLLM name {self.name}>"


def describe_vllm(importer: Importer = importlib.import_module, *, with_path: bool = True) -> str:
    """'vLLM 0.32.0 at /path/vllm' (or just 'vLLM 0.32.0') for messages; never raises."""
    try:
        mod = importer("vllm")
    except Exception:
        return "vLLM (not importable)"
    where = getattr(mod, "__file__", None) or "?"
    name = f"vLLM {getattr(mod, '__version__', '?')}"
    return f"{name} at {where.rsplit('/__init__.py', 1)[0]}" if with_path else name


def _module_missing(exc: ImportError, module: str) -> bool:
    """True when the module (or a parent package) does not exist, as opposed to existing and
    failing to import for a reason of its own."""
    name = getattr(exc, "name", None)
    return isinstance(exc, ModuleNotFoundError) and name is not None and (module == name or module.startswith(name + "."))


def _try(place: Place, importer: Importer) -> tuple[bool, Any]:
    try:
        mod = importer(place.module)
    except ImportError as exc:
        if _module_missing(exc, "vllm"):
            raise VllmUnsupported("vLLM is not installed in this Python environment "
                                  f"({exc.__class__.__name__}: {exc})") from None
        if _module_missing(exc, place.module):
            return False, None
        first = (str(exc).splitlines() or [""])[0]
        raise VllmUnsupported(f"{describe_vllm(importer)}: importing {place.module} fails: "
                              f"{type(exc).__name__}: {first}") from None
    if place.attr is None:
        return True, mod
    if hasattr(mod, place.attr):
        return True, getattr(mod, place.attr)
    return False, None


def resolve(name: str, importer: Importer = importlib.import_module) -> Any:
    """The object vLLM keeps under `name` (a key of SYMBOLS); a `Missing` for an absent optional
    name; VllmUnsupported (one line) for an absent required one."""
    places = SYMBOLS[name]
    for place in places:
        found, value = _try(place, importer)
        if found:
            return value
    looked = ", ".join(f"{p.module}.{p.attr}" if p.attr else p.module for p in places)
    why = f"{describe_vllm(importer)} lacks {name} (looked for {looked})"
    if name in OPTIONAL:
        return Missing(name, why)
    raise VllmUnsupported(why)


def check_all(importer: Importer = importlib.import_module, *, engine_tier: bool = False) -> list[str]:
    """Every required name of the scheduler harness (and of the engine tier, if asked) resolved now,
    so an unsupported vLLM fails before any work starts; returns the optional names it lacks."""
    names = [n for n in SYMBOLS if (engine_tier or n not in ENGINE_TIER) and n not in MODEL_CLASSES]
    return [n for n in names if isinstance(resolve(n, importer), Missing)]
