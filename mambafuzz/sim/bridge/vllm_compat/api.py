"""`from mambafuzz.sim.bridge.vllm_compat.api import Scheduler`: each vLLM name, found where the installed
release keeps it (symbols.py), resolved on first use and then cached in this module."""

from __future__ import annotations

from typing import Any

from mambafuzz.sim.bridge.vllm_compat.resolve import resolve
from mambafuzz.sim.bridge.vllm_compat.symbols import SYMBOLS


def __getattr__(name: str) -> Any:
    if name not in SYMBOLS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (add it to symbols.py)")
    value = resolve(name)
    globals()[name] = value
    return value
