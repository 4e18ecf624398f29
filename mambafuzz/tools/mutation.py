"""Every first-order mutant of vLLM's mamba scheduling functions, made by mutmut's mutation
operators from the *installed* vLLM source at run time, and applied to one process as a
reversible patch (mambafuzz.sim.patching), so no vLLM file is ever edited or copied.

Why not mutmut's own runner: it mutates files of this project (copied into `mutants/`, with
trampolines) and runs pytest; vLLM is an installed package and our "test suite" is a fuzz
campaign. So only its operator engine is used (docs/MUTATION.md says why mutmut, not cosmic-ray).

A mutant id is `mm:<Class.function>:<n>`: the n-th mutation (mutmut's visit order) of that
function's source. `mutants.patches(id)` accepts it, so `MAMBAFUZZ_MUTANT=mm:...` plants it in
every fuzz worker when `mambafuzz.sim.vllm_bridge` is imported, before atheris instruments anything
(the compiled mutant keeps vLLM's module, file and line numbers, so it is instrumented too).
Ids are stable for one installed source; `digest()` names that source so a stored result can
be matched to it.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import inspect
import textwrap
from dataclasses import dataclass
from functools import cache
from typing import Any

from mambafuzz.sim.patching import SOURCE_ATTR, FixNotApplicable, Wrap

PREFIX = "mm:"
SCHED = "vllm.v1.core.sched.scheduler"
STKM = "vllm.v1.core.single_type_kv_cache_manager"
# Target groups: a group name, or one `Class.function`, selects what to mutate.
GROUPS: dict[str, tuple[str, ...]] = {
    "split": (f"{SCHED}:Scheduler._mamba_block_aligned_split",),
    "MambaManager": (f"{STKM}:MambaManager.*",),
}
MODULE_OF = {"Scheduler": SCHED, "MambaManager": STKM}


class MutantError(ValueError):
    """A mutant id or target name that does not name a mutant of the installed vLLM."""


@dataclass(frozen=True)
class Mutant:
    id: str
    target: str  # module:Class.function
    line: int  # first changed line in vLLM's file
    change: str  # the changed lines, "-old | +new", for humans
    source: str  # the whole mutated function (dedented)


def _owner_and_function(target: str) -> tuple[Any, str, Any]:
    module_name, _, qual = target.partition(":")
    cls_name, _, fn_name = qual.partition(".")
    cls = getattr(importlib.import_module(module_name), cls_name, None)
    if cls is None or fn_name not in vars(cls):
        raise FixNotApplicable(f"{target}: not defined in the installed vLLM")
    return cls, fn_name, vars(cls)[fn_name]


def expand(names: list[str]) -> list[str]:
    """`module:Class.function` targets for group names and `Class.function` names."""
    out: list[str] = []
    for name in names:
        for spec in GROUPS.get(name, (name,)):
            if ":" not in spec:
                cls_name = spec.partition(".")[0]
                if cls_name not in MODULE_OF or "." not in spec:
                    raise MutantError(f"unknown mutation target {name!r}: use {', '.join(GROUPS)} or "
                                      f"Class.function with Class one of {', '.join(MODULE_OF)}")
                spec = f"{MODULE_OF[cls_name]}:{spec}"
            if spec.endswith(".*"):
                module_name, _, cls_name = spec[:-2].partition(":")
                cls = getattr(importlib.import_module(module_name), cls_name)
                out += [f"{module_name}:{cls_name}.{k}" for k, v in vars(cls).items()
                        if inspect.isfunction(getattr(v, "__func__", v))]
            else:
                out.append(spec)
    return out


@cache
def function_source(target: str) -> tuple[str, int, str]:
    """(dedented source, first line, file) of the installed function."""
    _, _, attr = _owner_and_function(target)
    fn = getattr(attr, "__func__", attr)
    lines, first = inspect.getsourcelines(fn)
    return textwrap.dedent("".join(lines)), first, fn.__code__.co_filename


def digest(target: str) -> str:
    return hashlib.sha256(function_source(target)[0].encode()).hexdigest()[:12]


@cache
def mutants_of(target: str) -> tuple[Mutant, ...]:
    """Every mutant mutmut's operators make of `target`'s source, in mutmut's visit order."""
    try:
        import libcst as cst
        from mutmut.mutation.file_mutation import MutationVisitor
        from mutmut.mutation.mutators import mutation_operators
        from mutmut.mutation.pragma_handling import IgnoredCode
    except ImportError as exc:
        raise MutantError(f"mutmut 3.8 is needed to generate mutants ({exc}): pip install -e '.[mutation]'") from None

    src, first, _ = function_source(target)
    module = cst.parse_module(src)
    wrapper = cst.MetadataWrapper(module)
    visitor = MutationVisitor(mutation_operators, IgnoredCode(set(), set(), set()))
    module = wrapper.visit(visitor)  # the mutations' nodes belong to the wrapper's copy
    qual = target.partition(":")[2]
    out = []
    for n, m in enumerate(visitor.mutations):
        new = module.deep_replace(m.original_node, m.mutated_node).code
        diff = [d for d in difflib.unified_diff(src.splitlines(), new.splitlines(), lineterm="", n=0)]
        hunk = next((d for d in diff if d.startswith("@@")), "@@ -1 @@")
        line = first - 1 + int(hunk.split()[1].lstrip("-").split(",")[0] or 1)
        change = " | ".join(" ".join(d.split()) for d in diff if d[:1] in "+-" and d[:3] not in ("+++", "---"))
        out.append(Mutant(f"{PREFIX}{qual}:{n}", target, line, change, new))
    return tuple(out)


def list_mutants(names: list[str]) -> list[Mutant]:
    return [m for t in expand(names) for m in mutants_of(t)]


def find(mutant_id: str) -> Mutant:
    qual, _, n = mutant_id.removeprefix(PREFIX).rpartition(":")
    if not mutant_id.startswith(PREFIX) or not qual or not n.isdigit():
        raise MutantError(f"bad mutant id {mutant_id!r}: expected {PREFIX}Class.function:N")
    found = mutants_of(expand([qual])[0])
    if int(n) >= len(found):
        raise MutantError(f"no mutant {mutant_id}: {qual} has {len(found)} in the installed vLLM")
    return found[int(n)]


def compile_mutant(m: Mutant) -> Any:
    """The mutated function, compiled under vLLM's file name and line numbers, in the original
    function's globals, with `__class__` bound so zero-argument `super()` still works."""
    cls, _, _ = _owner_and_function(m.target)
    _, first, filename = function_source(m.target)
    fn_name = m.target.rpartition(".")[2]
    # The factory's `def` line takes the line before the function, so line numbers stay vLLM's.
    text = f"def __mambafuzz_factory__(__class__):\n{textwrap.indent(m.source, '    ')}\n    return {fn_name}\n"
    code = compile("\n" * max(first - 2, 0) + text, filename, "exec")
    namespace: dict[str, Any] = {}
    exec(code, _owner_globals(m.target), namespace)  # noqa: S102 - vLLM's own source, mutated
    made = namespace["__mambafuzz_factory__"](cls)
    fn = made.__func__ if isinstance(made, classmethod | staticmethod) else made
    fn.__qualname__ = m.target.partition(":")[2]
    # inspect would read vLLM's unmutated file at these lines: a known fix that rewrites this
    # function (patching.Rewrite) must edit the mutant's text, not silently undo the mutant.
    setattr(fn, SOURCE_ATTR, (first, m.source))
    return fn


def _owner_globals(target: str) -> dict[str, Any]:
    _, _, attr = _owner_and_function(target)
    return getattr(attr, "__func__", attr).__globals__


def patches(mutant_id: str) -> list[Wrap]:
    """The one patch that plants `mutant_id` (a mutant of vLLM's own method never wraps a
    `--split` candidate: under `--split fixed` the installed method is what runs)."""
    m = find(mutant_id)
    fn = compile_mutant(m)

    def make(current):
        return staticmethod(fn) if isinstance(current, staticmethod) else fn
    return [Wrap(m.target, make, wraps_candidates=False)]
