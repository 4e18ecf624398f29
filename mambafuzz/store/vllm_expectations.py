"""A case's verdicts that differ on some vLLM releases: the optional `expected_by_vllm` key,
{"0.28": {"fixed": "stall"}, ...}, overrides `expected` only when the installed vLLM's version
matches the key (a release prefix: "0.28" matches 0.28.0 and 0.28.1, "0.28.0" only that one).
Kept apart from `expected` so that key's own layout can change without touching this."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import cache

KEY = "expected_by_vllm"


def release(version: str) -> tuple[int, ...]:
    """(0, 28, 0) for "0.28.0", "0.28.0+cpu" or "0.28.0rc1"; () when there is no leading number."""
    m = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(x) for x in m.group(0).split(".")) if m else ()


def matches(key: str, version: str) -> bool:
    want, have = release(key), release(version)
    return bool(want) and have[:len(want)] == want


def problems(value: object, known_kinds: tuple[str, ...]) -> list[str]:
    """What is wrong with an `expected_by_vllm` value (nothing when it is well formed)."""
    if not isinstance(value, dict):
        return [f"{KEY} must map vLLM versions to split -> verdict tables"]
    out = []
    for version, table in value.items():
        if not release(str(version)):
            out.append(f"{KEY}: {version!r} is not a vLLM version")
        if not isinstance(table, dict) or any(not isinstance(k, str) or v not in known_kinds for k, v in table.items()):
            out.append(f"{KEY}[{version!r}] must map split names to one of {', '.join(known_kinds)}")
    return out


@cache
def _installed() -> str:
    from mambafuzz.sim.bridge.vllm_compat.about import vllm_version  # imports vLLM: only when a case needs it

    return vllm_version()


def for_installed(expected: Mapping[str, str], by_vllm: Mapping[str, Mapping[str, str]] | None,
                  installed: Callable[[], str] | None = None) -> dict[str, str]:
    """`expected` with the overrides of every key matching the installed vLLM (longer keys last,
    so "0.28.0" beats "0.28")."""
    out = dict(expected)
    if not by_vllm:
        return out
    version = (installed or _installed)()
    for key in sorted(by_vllm, key=lambda k: len(release(k))):
        if matches(key, version):
            out.update(by_vllm[key])
    return out
