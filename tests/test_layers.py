"""The layers in mambafuzz/__init__.py (`LAYERS`) are one-way: every import in mambafuzz/**, the
ones inside functions too (and `importlib.import_module("mambafuzz...")` with a literal name),
points to its own layer or a lower one, the modules import one another without a cycle, and no
module plants, patches or enables anything when it is imported.  A module named by a string (a
registry's "module:function", a subprocess's `-m mambafuzz...`) is a dependency too: the name must
exist, and one that points up the layers must be declared below with its reason.

Read from the source (AST), not from a running interpreter, so a function-local import that no
test happens to reach is held to the order as well."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

import mambafuzz
from mambafuzz import LAYERS

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "mambafuzz"

# Module-level calls whose names say they plant, patch or enable something (`planting.apply`,
# `triton_cpu.enable`, a bridge's `_apply_planted_bug`, ...): on import they would change the process for
# whoever imports. The one start-up step (mambafuzz.search.startup.prepare_worker) does these
# when an entry point asks.
SIDE_EFFECT_WORDS = ("apply", "plant", "patch", "enable", "install", "prepare")
# Scripts, run and never imported: their top level is their entry point, which calls the step.
ENTRY_SCRIPTS = {"mambafuzz/search/targets/fuzz_scheduler.py"}  # the atheris target (libFuzzer re-runs it)

# A string literal that is a whole dotted mambafuzz name, optionally with ":function".
NAME_REFERENCE = re.compile(r"^mambafuzz(?:\.\w+)+(?::\w+)?$")
# Dotted names that are not modules: a logger's name.
NOT_MODULE_NAMES = {"mambafuzz.audit"}
# Names that point up the layers on purpose, each a late binding an import cannot be:
DECLARED_NAME_EDGES = {
    ("mambafuzz.findings", "mambafuzz.checks.oracle"):
        "the oracle registry names each kind's check; mambafuzz.checks.oracle.judge loads it",
    ("mambafuzz.findings", "mambafuzz.checks.resources"):
        "the oracle registry names the resource checks; mambafuzz.checks.oracle.judge loads them",
    ("mambafuzz.findings", "mambafuzz.checks.attention_kv"):
        "the oracle registry names the attention-block check; mambafuzz.checks.oracle.judge loads it",
    ("mambafuzz.findings", "mambafuzz.checks.cache_keys"):
        "the oracle registry names the attention-key check; mambafuzz.checks.oracle.judge loads it",
    ("mambafuzz.findings", "mambafuzz.checks.cache_reset"):
        "the oracle registry names the prefix-cache reset check; mambafuzz.checks.oracle.judge loads it",
    ("mambafuzz.tools.vllm_envs", "mambafuzz.cli.main"):
        "runs the mambafuzz command with another vLLM's interpreter (a subprocess, not an import)",
}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module (the deepest mambafuzz module the name resolves to)
    where: str  # path:line
    lazy: bool  # inside a function


def module_name(rel: Path) -> str:
    """mambafuzz/sim/engine/harness.py -> mambafuzz.sim.engine.harness; a package's __init__ is the package."""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    """The index in LAYERS of `module` ("mambafuzz.sim.engine.harness" -> the index of ("sim",))."""
    parts = module.split(".")
    if len(parts) == 1:  # the package itself: the docstring and LAYERS
        return 0
    for i, layer in enumerate(LAYERS):
        if parts[1] in layer:
            return i
    raise KeyError(f"{module}: in no layer of mambafuzz.LAYERS")


def layer_name(i: int) -> str:
    return "/".join(LAYERS[i])


def package_sources(pkg: Path = PKG) -> dict[str, tuple[str, str]]:
    """module name -> (path relative to the checkout, source) for every module under `pkg`."""
    return {module_name(p.relative_to(pkg.parent)): (str(p.relative_to(pkg.parent)), p.read_text())
            for p in sorted(pkg.rglob("*.py"))}


def _resolve(name: str, modules: Iterable[str]) -> str | None:
    """The deepest known module `name` names: `mambafuzz.sim.engine.harness.evaluate` -> `mambafuzz.sim.engine.harness`."""
    modules = set(modules)
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        return [f"{prefix}.{a.name}" for a in node.names] + [prefix]
    if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                 or (isinstance(node.func, ast.Name) and node.func.id in {"import_module", "__import__"}))):
        return [node.args[0].value]
    return []


def _edges_under(node: ast.AST, module: str, path: str, modules: Mapping[str, object], lazy: bool) -> Iterable[Edge]:
    names = [n for n in _imported_names(node, module, path.endswith("__init__.py")) if n.split(".")[0] == "mambafuzz"]
    targets = {_resolve(n, modules) for n in names} - {None, module}
    if isinstance(node, ast.ImportFrom) and len(targets) > 1:
        # `from mambafuzz.sim.engine import harness`: the submodule, not the package as well
        targets.discard(_resolve(names[-1], modules))
    for target in sorted(targets):
        yield Edge(module, target, f"{path}:{node.lineno}", lazy)
    inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    for child in ast.iter_child_nodes(node):
        yield from _edges_under(child, module, path, modules, inner)


def import_edges(sources: Mapping[str, tuple[str, str]]) -> list[Edge]:
    """Every import of one mambafuzz module by another, module-level or function-local."""
    return [e for module, (path, text) in sources.items()
            for e in _edges_under(ast.parse(text, filename=path), module, path, sources, False)]


def _top_level_names(text: str) -> set[str]:
    """Names a module binds at its top level (defs, classes, assignments, imports)."""
    names = set()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def name_edges(sources: Mapping[str, tuple[str, str]]) -> tuple[list[Edge], list[str]]:
    """The modules named by string literals (NAME_REFERENCE) as edges, and 'path:line name (why)'
    for each name that does not exist: no such module, or no such attribute in it."""
    edges, missing = [], []
    for module, (path, text) in sources.items():
        for node in ast.walk(ast.parse(text, filename=path)):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and NAME_REFERENCE.match(node.value)) or node.value in NOT_MODULE_NAMES:
                continue
            dotted, _, function = node.value.partition(":")
            target = _resolve(dotted, sources)
            where = f"{path}:{node.lineno}"
            rest = [*dotted[len(target or ""):].strip(".").split("."), function]
            attrs = [a for a in rest if a]
            if target in (None, "mambafuzz"):
                missing.append(f"{where} {node.value} (no such module)")
                continue
            if attrs and attrs[0] not in _top_level_names(sources[target][1]):
                missing.append(f"{where} {node.value} (no {attrs[0]} in {target})")
            if target != module:
                edges.append(Edge(module, target, where, lazy=True))
    return edges, missing


def undeclared_name_back_edges(edges: Iterable[Edge]) -> list[str]:
    """The back edges among names that DECLARED_NAME_EDGES does not declare."""
    return [line for e in edges if (e.source, e.target) not in DECLARED_NAME_EDGES
            for line in back_edges([e])]


def back_edges(edges: Iterable[Edge]) -> list[str]:
    """'path:line source -> target (from-layer -> to-layer)' for each edge that points up."""
    out = []
    for e in edges:
        src, dst = layer_of(e.source), layer_of(e.target)
        if dst > src:
            out.append(f"{e.where} {e.source} -> {e.target} ({layer_name(src)} -> {layer_name(dst)})"
                       + (" [in a function]" if e.lazy else ""))
    return out


def cycles(edges: Iterable[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(found)


def import_time_side_effects(sources: Mapping[str, tuple[str, str]]) -> list[str]:
    """'path:line call()' for each module-level call whose name has one of SIDE_EFFECT_WORDS
    (outside any function or class body, `if __name__ == "__main__":` blocks excepted)."""
    return [f"{path}:{line} {call}" for path, text in sources.values() if path not in ENTRY_SCRIPTS
            for line, call in _module_level_calls(ast.parse(text, filename=path))
            if any(w in call.rpartition(".")[2].lower() for w in SIDE_EFFECT_WORDS)]


def _module_level_calls(node: ast.AST) -> Iterable[tuple[int, str]]:
    """(line, 'name()') of each call run on import: not in a function or class body, nor under
    `if __name__ == "__main__":`."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
        return
    if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
        return
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
        yield node.lineno, f"{ast.unparse(node.func)}()"
    for child in ast.iter_child_nodes(node):
        yield from _module_level_calls(child)


# ---- the package -------------------------------------------------------------------------

SOURCES = package_sources()
EDGES = import_edges(SOURCES)
NAME_EDGES, MISSING_NAMES = name_edges(SOURCES)


def test_every_module_is_in_one_layer_and_the_docstring_names_them_in_order():
    names = [n for layer in LAYERS for n in layer]
    assert len(names) == len(set(names)), "a name in two layers"
    tops = {p.stem for p in PKG.glob("*.py") if p.name != "__init__.py"}
    tops |= {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert tops == set(names), f"in no layer: {sorted(tops - set(names))}; no such module: {sorted(set(names) - tops)}"
    doc = mambafuzz.__doc__
    positions = [doc.index(f"`mambafuzz.{n}`") for n in names]
    assert positions == sorted(positions), "the docstring lists the layers in another order than LAYERS"


def test_imports_point_only_to_the_same_or_a_lower_layer():
    bad = back_edges(EDGES)
    assert not bad, f"{len(bad)} import(s) against the layer order (mambafuzz.LAYERS):\n" + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(EDGES)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_module_named_by_a_string_exists_and_points_down_or_is_declared():
    assert not MISSING_NAMES, "names of mambafuzz modules or functions that do not exist:\n" + "\n".join(MISSING_NAMES)
    bad = undeclared_name_back_edges(NAME_EDGES)
    assert not bad, ("modules named by a string against the layer order (import them from a higher "
                     "layer, or declare the late binding in DECLARED_NAME_EDGES):\n" + "\n".join(bad))
    stale = set(DECLARED_NAME_EDGES) - {(e.source, e.target) for e in NAME_EDGES}
    assert not stale, f"declared name edges nothing uses any more: {sorted(stale)}"


def test_nothing_plants_patches_or_enables_at_import_time():
    found = import_time_side_effects(SOURCES)
    assert not found, ("module-level calls that change the process on import (call them from "
                       "an entry point's start-up step, mambafuzz.search.startup.prepare_process, instead):\n" + "\n".join(found))


# ---- the checker fails when it should ------------------------------------------------------

def _with(extra: dict[str, str]) -> dict[str, tuple[str, str]]:
    """The package's module names with no imports of their own, plus `extra` ({path: source})."""
    sources = {module: (path, "") for module, (path, _) in SOURCES.items()}
    for path, text in extra.items():
        sources[module_name(Path(path))] = (path, text)
    return sources


def test_a_planted_back_edge_is_reported_with_its_place_and_layers():
    sources = _with({"mambafuzz/sim/x.py": "import os\n\n\ndef f():\n    from mambafuzz.search import supervisor\n"})
    bad = back_edges(import_edges(sources))
    assert bad == ["mambafuzz/sim/x.py:5 mambafuzz.sim.x -> mambafuzz.search.supervisor (sim -> search) [in a function]"]


@pytest.mark.parametrize("text", [
    "import mambafuzz.cli.main\n",
    "from mambafuzz.upstream.export import test_source\n",
    "from ..store import corpus\n",
    "import importlib\nM = importlib.import_module('mambafuzz.checks.pipeline')\n",
])
def test_every_import_form_is_seen(text):
    bad = back_edges(import_edges(_with({"mambafuzz/model/x.py": text})))
    assert len(bad) == 1 and bad[0].startswith("mambafuzz/model/x.py:"), bad


def test_a_planted_cycle_is_reported():
    sources = _with({"mambafuzz/model/a.py": "def f():\n    import mambafuzz.model.b\n",
                     "mambafuzz/model/b.py": "from mambafuzz.model import a\n"})
    assert ["mambafuzz.model.a", "mambafuzz.model.b"] in cycles(import_edges(sources))


def test_a_planted_import_time_patch_is_reported():
    sources = _with({"mambafuzz/sim/x.py": "import os\n\nif os.environ.get('M'):\n    _apply_planted_bug()\n",
                     "mambafuzz/conform/x.py": "def f():\n    triton_cpu.enable()\n"})  # in a function: fine
    assert import_time_side_effects(sources) == ["mambafuzz/sim/x.py:4 _apply_planted_bug()"]


def test_a_planted_string_or_subprocess_dependency_is_reported():
    sources = _with({
        "mambafuzz/model/x.py": "import subprocess\n\n\ndef f():\n"
                                "    subprocess.run(['python', '-m', 'mambafuzz.cli.main'])\n",
        "mambafuzz/sim/y.py": "CHECK = 'mambafuzz.checks.pipeline:evaluate'\n",
    })
    edges, missing = name_edges(sources)
    assert missing == ["mambafuzz/sim/y.py:1 mambafuzz.checks.pipeline:evaluate (no evaluate in mambafuzz.checks.pipeline)"]
    assert undeclared_name_back_edges(edges) == [
        "mambafuzz/model/x.py:5 mambafuzz.model.x -> mambafuzz.cli.main (model -> cli) [in a function]",
        "mambafuzz/sim/y.py:1 mambafuzz.sim.y -> mambafuzz.checks.pipeline (sim -> checks) [in a function]",
    ]


def test_a_name_that_is_no_module_is_reported():
    _, missing = name_edges(_with({"mambafuzz/model/x.py": "M = 'mambafuzz.nowhere.at_all'\n"}))
    assert missing == ["mambafuzz/model/x.py:1 mambafuzz.nowhere.at_all (no such module)"]
