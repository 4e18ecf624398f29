"""The exit codes and error types every `mambafuzz` command and CI job shares.

One table, so that a CI job can tell a finding from a broken tool: an unexpected exception in
mambafuzz, a worker that could not start, or a campaign that executed nothing is a tool
failure (3), never "something was found" (1).
"""

from __future__ import annotations

import traceback
from pathlib import Path

EXIT_CLEAN = 0  # ran, nothing found
EXIT_FOUND = 1  # a violation (repro), or a new finding (fuzz)
EXIT_USAGE = 2  # bad input: a malformed file, an impossible config, a wrong flag
EXIT_TOOL = 3  # mambafuzz itself failed: unsupported vLLM, dead workers, nothing executed
EXIT_INTERRUPTED = 130

MEANING = {EXIT_CLEAN: "clean", EXIT_FOUND: "found", EXIT_USAGE: "usage error", EXIT_TOOL: "tool failure",
           EXIT_INTERRUPTED: "interrupted"}


class UsageError(Exception):
    """Bad input or flags; the message is printed as one line and the command exits 2."""


class ToolError(Exception):
    """mambafuzz could not do its job; the message is printed as one line and the command exits 3."""

    stops_worker = False  # True: every later input would fail the same way, so a fuzz worker stops


def one_line(exc: BaseException, where: bool = False) -> str:
    """`Type: first line of the message`, and with `where` the innermost frame
    (` at file.py:LINE in function`): how every tool failure is said in one line."""
    text = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    tb = traceback.extract_tb(exc.__traceback__) if where and exc.__traceback__ else None
    return text + (f" at {Path(tb[-1].filename).name}:{tb[-1].lineno} in {tb[-1].name}" if tb else "")
