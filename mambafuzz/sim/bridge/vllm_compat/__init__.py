"""The only door to vLLM. Every other module imports vLLM names from `mambafuzz.sim.bridge.vllm_compat.api`,
which finds each one wherever the installed release keeps it (`symbols.py`), so a release that
moves or drops something fails in one place with one line (`VllmUnsupported`), not with an
ImportError deep inside the fuzzer."""

from __future__ import annotations

from mambafuzz.exit_codes import ToolError


class VllmUnsupported(ToolError):
    """The installed vLLM lacks something mambafuzz needs. str() is one line naming the missing
    piece and the vLLM it was looked for in; the CLI prints it and exits with EXIT_TOOL."""

    stops_worker = True
