"""One line naming the mambafuzz and vLLM in use, for `mambafuzz --version` and for findings:
a finding is only meaningful next to the vLLM it was found on."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from mambafuzz.sim.bridge.vllm_compat import VllmUnsupported
from mambafuzz.sim.bridge.vllm_compat.resolve import resolve


def mambafuzz_version() -> str:
    try:
        return importlib.metadata.version("mambafuzz")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout on PYTHONPATH
        pyproject = Path(__file__).resolve().parents[4] / "pyproject.toml"
        try:
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


def vllm_version() -> str:
    """The installed vLLM's own `__version__` ("none" when vLLM does not import)."""
    try:
        return str(getattr(resolve("vllm_package"), "__version__", "unknown"))
    except VllmUnsupported:
        return "none"


def vllm_path() -> str:
    try:
        return str(Path(resolve("vllm_package").__file__).parent)
    except VllmUnsupported as exc:
        return f"({exc})"


def version_line() -> str:
    return f"mambafuzz {mambafuzz_version()}, vLLM {vllm_version()} at {vllm_path()}"
