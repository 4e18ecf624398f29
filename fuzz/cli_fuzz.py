"""The fuzzing subcommands of `mambafuzz` (fuzz, minimize, corpus)."""

from __future__ import annotations


def add_commands(sub) -> None:
    return None
