"""Candidate fixes as reversible patches of the installed vLLM, so one process can replay a
scenario with and without a fix (attribution, benchmarks, validation).

A patch names its target as `module:Qual.name` and either wraps the current attribute
(`Wrap`) or rewrites the current function's source text (`Rewrite`). Both fail with
`FixNotApplicable` when the target is gone or its source no longer has the text a fix edits:
a vLLM upgrade then says which fix stopped applying instead of silently testing nothing.

`Scheduler._mamba_block_aligned_split` is special: a `--split` candidate is bound on the
scheduler instance and bypasses the class attribute, so wraps of that target are also kept
in a stack that `scheduler_session.SchedulerSession` applies around the candidate.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPLIT_TARGET = "vllm.v1.core.sched.scheduler:Scheduler._mamba_block_aligned_split"
SOURCE_ATTR = "__mambafuzz_source__"  # the rewritten text, so a second Rewrite can edit it again


class FixNotApplicable(RuntimeError):
    """The installed vLLM no longer has what a fix patches (target missing or changed)."""


class PatchSpecError(ValueError):
    """A --patch value that does not name patches."""


def resolve_target(target: str) -> tuple[Any, str]:
    """(owner object, attribute name) for `module:Qual.name`."""
    module_name, _, qual = target.partition(":")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise FixNotApplicable(f"{target}: cannot import {module_name} ({exc})") from None
    *path, attr = qual.split(".")
    for part in path:
        if not hasattr(owner, part):
            raise FixNotApplicable(f"{target}: {part} not found in the installed vLLM")
        owner = getattr(owner, part)
    if not hasattr(owner, attr):
        raise FixNotApplicable(f"{target}: {attr} not found in the installed vLLM")
    return owner, attr


@dataclass(frozen=True)
class Wrap:
    """Replace `target` with `make(current)`; `current` is whatever is installed (vLLM's own
    function, a mutant, or another fix), so wraps compose."""

    target: str
    make: Callable[[Callable[..., Any]], Callable[..., Any]]
    # For the split target: also wrap a --split candidate (a fix does; a planted bug in
    # vLLM's own method does not).
    wraps_candidates: bool = True

    def replacement(self, current: Any) -> Any:
        if isinstance(current, classmethod):
            return classmethod(self.make(current.__func__))
        return self.make(current)


@dataclass(frozen=True)
class Rewrite:
    """Replace `target` with its own source where each `old` text is swapped for `new`
    (each `old` must occur exactly once). Compiled under the original file name and line
    numbers, so crash locations and tracebacks keep pointing into vLLM's file."""

    target: str
    edits: tuple[tuple[str, str], ...]

    def replacement(self, current: Any) -> Any:
        fn = current.__func__ if isinstance(current, classmethod | staticmethod) else current
        src = getattr(fn, SOURCE_ATTR, None)
        if src is None:
            try:
                lines, first = inspect.getsourcelines(fn)
            except (OSError, TypeError) as exc:
                raise FixNotApplicable(f"{self.target}: no source to rewrite ({exc})") from None
            src = (first, textwrap.dedent("".join(lines)))
        first, text = src
        for old, new in self.edits:
            old_d, new_d = textwrap.dedent(old).strip("\n"), textwrap.dedent(new).strip("\n")
            hits = _find_indented(text, old_d)
            if len(hits) != 1:
                raise FixNotApplicable(f"{self.target}: the text this fix edits occurs {len(hits)} times "
                                       f"in the installed source (expected once): {old_d.splitlines()[0]!r}")
            start, end, indent = hits[0]
            text = text[:start] + textwrap.indent(new_d, indent) + "\n" + text[end:]
        code = compile("\n" * (first - 1) + text, fn.__code__.co_filename, "exec")
        namespace: dict[str, Any] = {}
        exec(code, fn.__globals__, namespace)  # noqa: S102 - vLLM's own source, edited
        new_fn = namespace[fn.__name__]
        new_fn.__qualname__ = fn.__qualname__
        setattr(new_fn, SOURCE_ATTR, (first, text))
        return classmethod(new_fn) if isinstance(current, classmethod) else new_fn


def _find_indented(text: str, snippet: str) -> list[tuple[int, int, str]]:
    """Where `snippet` (dedented lines) occurs in `text` at a common indentation:
    (start, end, indent) of each whole-line occurrence."""
    want = snippet.splitlines()
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))
    hits = []
    for i in range(len(lines) - len(want) + 1):
        first = lines[i].rstrip("\n")
        indent = first[: len(first) - len(first.lstrip())]
        if all(lines[i + k].rstrip("\n") == (indent + w if w else "") for k, w in enumerate(want)):
            hits.append((offsets[i], offsets[i + len(want)], indent))
    return hits


Patch = Wrap | Rewrite

# Wraps of the split, innermost first, for candidates bound on the scheduler instance.
split_wraps: list[Wrap] = []


def wrap_split(split: Callable[..., int]) -> Callable[..., int]:
    """A `--split` candidate wrapped by every active fix of the split target."""
    for w in split_wraps:
        split = w.make(split)
    return split


@contextlib.contextmanager
def applied(patches: Sequence[Patch]) -> Iterator[None]:
    """Apply `patches` in order, restore everything on exit (also when one fails to apply)."""
    undo: list[Callable[[], None]] = []
    try:
        for p in patches:
            undo.append(apply_one(p))
        yield
    finally:
        for u in reversed(undo):
            u()


def apply_one(p: Patch) -> Callable[[], None]:
    """Apply one patch; returns the function that restores what it replaced."""
    owner, attr = resolve_target(p.target)
    had_own = isinstance(owner, type) and attr in vars(owner)
    current = vars(owner)[attr] if had_own else getattr(owner, attr)
    setattr(owner, attr, p.replacement(current))
    is_split = p.target == SPLIT_TARGET and isinstance(p, Wrap) and p.wraps_candidates
    if is_split:
        split_wraps.append(p)

    def restore() -> None:
        if had_own or not isinstance(owner, type):
            setattr(owner, attr, current)
        else:  # it was inherited: uncover the base class's attribute again
            delattr(owner, attr)
        if is_split:
            split_wraps.remove(p)
    return restore


def check_applies(patches: Sequence[Patch]) -> str | None:
    """None when every patch applies to the installed vLLM, else why not (nothing stays applied)."""
    try:
        with applied(patches):
            return None
    except FixNotApplicable as exc:
        return str(exc)


def load_patches(spec: str) -> list[Patch]:
    """Patches named by a --patch value: `path/to/fix.py` (its PATCHES), or
    `package.module:NAME` where NAME is a list of patches or a function returning one."""
    if spec.endswith(".py"):
        path = Path(spec)
        if not path.is_file():
            raise PatchSpecError(f"--patch {spec}: no such file")
        mod_name = "mambafuzz_fix_" + "_".join(path.resolve().parts[-3:-1]).replace("-", "_").replace(".", "_")
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        was, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ among the cases
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001 - a broken fix file is a usage error, named
            raise PatchSpecError(f"--patch {spec}: cannot load ({type(exc).__name__}: {exc})") from None
        finally:
            sys.dont_write_bytecode = was
        value: Any = getattr(module, "PATCHES", None)
    else:
        module_name, sep, attr = spec.partition(":")
        if not sep:
            raise PatchSpecError(f"--patch {spec}: use path/to/fix.py or package.module:NAME")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001
            raise PatchSpecError(f"--patch {spec}: cannot import {module_name} ({type(exc).__name__}: {exc})") from None
        value = getattr(module, attr, None)
    if callable(value):
        value = value()
    if not isinstance(value, list | tuple) or not all(isinstance(p, Wrap | Rewrite) for p in value):
        raise PatchSpecError(f"--patch {spec}: expected a list of mambafuzz.sim.patching.Wrap/Rewrite (PATCHES)")
    return list(value)
