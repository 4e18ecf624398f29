"""Every first-order mutant of vLLM's mamba scheduling functions, made by mutmut's mutation
operators from the *installed* vLLM source at run time, and applied to one process as a
reversible patch (mambafuzz.sim.patching), so no vLLM file is ever edited or copied.

Why not mutmut's own runner: it mutates files of this project (copied into `mutants/`, with
trampolines) and runs pytest; vLLM is an installed package and our "test suite" is a fuzz
campaign. So only its operator engine is used (docs/MUTATION.md says why mutmut, not cosmic-ray).

A mutant id is `mm:<Class.function>:<n>`: the n-th mutation (mutmut's visit order) of that
function's source. `mutants.patches(id)` accepts it, so `MAMBAFUZZ_MUTANT=mm:...` plants it in
every fuzz worker when `mambafuzz.sim.bridge.scheduler_session` is imported, before atheris instruments anything
(the compiled mutant keeps vLLM's module, file and line numbers, so it is instrumented too).
Ids are stable for one installed source; `digest()` names that source so a stored result can
be matched to it.

Large functions (`Scheduler.schedule`, `KVCacheManager.allocate_slots`, the coordinator's shared
methods) are mutated only where they concern align mode: `mamba_statements` keeps the mutations
its rule selects, and n counts the kept mutations in visit order (a function whose own or class
name names align mode, such as the split and MambaManager, keeps every mutation).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import inspect
import textwrap
from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import Any

from mambafuzz.sim.patching import SOURCE_ATTR, FixNotApplicable, Wrap
from mambafuzz.tools import mamba_statements

PREFIX = "mm:"
SCHED = "vllm.v1.core.sched.scheduler"
STKM = "vllm.v1.core.single_type_kv_cache_manager"
KVCM = "vllm.v1.core.kv_cache_manager"
COORD = "vllm.v1.core.kv_cache_coordinator"
# Target groups: a group name, or one `Class.function`, selects what to mutate. `Class.*` is the
# class's own methods; `Class.**` every method an instance of it runs (see `expand`).
GROUPS: dict[str, tuple[str, ...]] = {
    "split": (f"{SCHED}:Scheduler._mamba_block_aligned_split",),
    "MambaManager": (f"{STKM}:MambaManager.*",),
    "coordinator": (f"{COORD}:HybridKVCacheCoordinator.**",),
    "allocate_slots": (f"{KVCM}:KVCacheManager.allocate_slots",),
    "get_computed_blocks": (f"{KVCM}:KVCacheManager.get_computed_blocks",),
    "schedule": (f"{SCHED}:Scheduler.schedule",),
    "update_from_output": (f"{SCHED}:Scheduler.update_from_output",),
}
MODULE_OF = {"Scheduler": SCHED, "MambaManager": STKM, "KVCacheManager": KVCM, "KVCacheCoordinator": COORD,
             "HybridKVCacheCoordinator": COORD}


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
            if spec.endswith(".**"):
                module_name, _, cls_name = spec[:-3].partition(":")
                out += _methods_run_by(getattr(importlib.import_module(module_name), cls_name))
            elif spec.endswith(".*"):
                module_name, _, cls_name = spec[:-2].partition(":")
                cls = getattr(importlib.import_module(module_name), cls_name)
                out += [f"{module_name}:{cls_name}.{k}" for k, v in vars(cls).items() if _is_function(v)]
            else:
                out.append(spec)
    return out


def _is_function(attr: Any) -> bool:
    return inspect.isfunction(getattr(attr, "__func__", attr))


def _methods_run_by(cls: type) -> list[str]:
    """Every method of vLLM's own classes in `cls`'s MRO that an instance of `cls` runs: the one
    each name resolves to, and a base class's version that its override reaches through
    `super().name(` (the coordinator's `__init__`). A base method that is overridden without
    that never runs, so its mutants would be unreachable by construction."""
    mro = [c for c in cls.__mro__ if c.__module__.startswith("vllm.")]
    out = []
    for i, owner in enumerate(mro):
        for name, attr in vars(owner).items():
            if not _is_function(attr):
                continue
            override = next((c for c in mro[:i] if name in vars(c)), None)
            if override is not None:
                fn = vars(override)[name]
                if not _is_function(fn) or f"super().{name}(" not in inspect.getsource(getattr(fn, "__func__", fn)):
                    continue
            out.append(f"{owner.__module__}:{owner.__name__}.{name}")
    return out


@cache
def function_source(target: str) -> tuple[str, int, str]:
    """(dedented source, first line, file) of the installed function."""
    _, _, attr = _owner_and_function(target)
    fn = getattr(attr, "__func__", attr)
    lines, first = inspect.getsourcelines(fn)
    return textwrap.dedent("".join(lines)), first, fn.__code__.co_filename


def kept_whole(target: str) -> bool:
    """Every mutation of `target` is kept (its own or its class's name names align mode); else
    only those `mamba_statements` selects."""
    cls_name, _, fn_name = target.partition(":")[2].partition(".")
    return mamba_statements.whole(cls_name, fn_name)


def digest(target: str) -> str:
    """Names what the ids of `target` refer to: its source and, when filtered, the rule."""
    text = function_source(target)[0]
    if not kept_whole(target):
        text += "\n" + mamba_statements.RULE
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def mutants_of(target: str) -> tuple[Mutant, ...]:
    """Every mutant mutmut's operators make of `target`'s source that the rule keeps (all of them
    for a function kept whole), in mutmut's visit order."""
    return _generate(target)[1]


def count_all(target: str) -> int:
    """How many mutants mutmut's operators make of `target` before the rule selects."""
    return _generate(target)[0]


@cache
def _generate(target: str) -> tuple[int, tuple[Mutant, ...]]:
    src, first, _ = function_source(target)
    module, wrapper, every = visit(src)
    qual = target.partition(":")[2]
    kept = every if kept_whole(target) else mamba_statements.select(wrapper, every)
    out = []
    for n, m in enumerate(kept):
        new = module.deep_replace(m.original_node, m.mutated_node).code
        diff = [d for d in difflib.unified_diff(src.splitlines(), new.splitlines(), lineterm="", n=0)]
        hunk = next((d for d in diff if d.startswith("@@")), "@@ -1 @@")
        line = first - 1 + int(hunk.split()[1].lstrip("-").split(",")[0] or 1)
        change = " | ".join(" ".join(d.split()) for d in diff if d[:1] in "+-" and d[:3] not in ("+++", "---"))
        out.append(Mutant(f"{PREFIX}{qual}:{n}", target, line, change, new))
    return len(every), tuple(out)


def visit(src: str) -> tuple[Any, Any, list]:
    """(module, metadata wrapper, mutations) of mutmut's visitor over `src`; the mutations' nodes
    belong to the wrapper's copy of the module, which is the module returned."""
    try:
        import libcst as cst
        from mutmut.mutation.file_mutation import MutationVisitor
        from mutmut.mutation.mutators import mutation_operators
        from mutmut.mutation.pragma_handling import IgnoredCode
    except ImportError as exc:
        raise MutantError(f"mutmut 3.8 is needed to generate mutants ({exc}): pip install -e '.[mutation]'") from None
    wrapper = cst.MetadataWrapper(cst.parse_module(src))
    visitor = MutationVisitor(mutation_operators, IgnoredCode(set(), set(), set()))
    module = wrapper.visit(visitor)
    return module, wrapper, visitor.mutations


def statements(target: str) -> list[tuple[int, int, str]]:
    """(line in vLLM's file, mutants, that line's text) for each line the kept mutants change
    first: what the rule selected, for a reader (`bench/mutation_run.py --list --statements`)."""
    import linecache

    filename = function_source(target)[2]
    counts = Counter(m.line for m in mutants_of(target))
    return [(line, k, linecache.getline(filename, line).strip()) for line, k in sorted(counts.items())]


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
    """The mutated function, compiled as vLLM compiled the original: see `compile_method`."""
    cls, _, _ = _owner_and_function(m.target)
    _, first, filename = function_source(m.target)
    fn = compile_method(m.source, cls, m.target.rpartition(".")[2], first, filename, _owner_globals(m.target))
    fn.__qualname__ = m.target.partition(":")[2]
    # inspect would read vLLM's unmutated file at these lines: a known fix that rewrites this
    # function (patching.Rewrite) must edit the mutant's text, not silently undo the mutant.
    setattr(fn, SOURCE_ATTR, (first, m.source))
    return fn


def compile_method(source: str, cls: type, name: str, first: int, filename: str, globals_: dict[str, Any]) -> Any:
    """`source` (one dedented method, `name`) compiled in a class body named like `cls`, under vLLM's file
    name and first line number, in the original module's globals (so `__module__` and every global
    stay vLLM's): the class body mangles private names (`self.__x`) as vLLM's class does, and its
    `__class__` cell is pointed at `cls`, so zero-argument `super()` works. Returns the function."""
    text = f"class {cls.__name__}:\n{textwrap.indent(source, '    ')}\n"
    # The class line takes the line before the method, so line numbers stay vLLM's.
    code = compile("\n" * max(first - 2, 0) + text, filename, "exec")
    namespace: dict[str, Any] = {}
    exec(code, globals_, namespace)  # noqa: S102 - vLLM's own source, mutated
    made = vars(namespace[cls.__name__])[name]
    fn = made.__func__ if isinstance(made, classmethod | staticmethod) else made
    if "__class__" in fn.__code__.co_freevars:
        fn.__closure__[fn.__code__.co_freevars.index("__class__")].cell_contents = cls
    return fn


def identity(target: str) -> Mutant:
    """The unmutated function as a mutant: planting it must change nothing (the tests replay
    cases with it to show the compilation above keeps vLLM's behaviour)."""
    src, first, _ = function_source(target)
    return Mutant(f"{PREFIX}{target.partition(':')[2]}:identity", target, first, "", src)


def _owner_globals(target: str) -> dict[str, Any]:
    _, _, attr = _owner_and_function(target)
    return getattr(attr, "__func__", attr).__globals__


def patches(mutant_id: str) -> list[Wrap]:
    """The one patch that plants `mutant_id` (a mutant of vLLM's own method never wraps a
    `--split` candidate: under `--split fixed` the installed method is what runs)."""
    return planting(find(mutant_id))


def planting(m: Mutant) -> list[Wrap]:
    fn = compile_mutant(m)

    def make(current):
        return staticmethod(fn) if isinstance(current, staticmethod) else fn
    return [Wrap(m.target, make, wraps_candidates=False)]
