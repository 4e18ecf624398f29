"""Which mutations of a large vLLM function concern mamba "align" mode: a rule over the
function's syntax tree (libcst), read from the installed source at run time, so a vLLM upgrade
moves the selection with the code instead of leaving hand-typed line numbers behind.

The rule. A mutation is judged by the innermost *unit* that holds what it changes, and by every
unit around that one; it is kept when any of them names (as an identifier, never a comment or a
string) one of `WORDS`:
- a call argument: its own identifiers and the called expression's (an argument of
  `self._mamba_block_aligned_split(...)` counts). A mutation that drops or replaces an argument
  is judged by that argument;
- a parameter of the function (`num_lookahead_tokens: int = 0`);
- a simple statement: its identifiers outside call arguments (the assigned names, the callee, the
  operands), so `SchedulerOutput(..., kv_cache_block_copies=...)` keeps that argument's
  mutations, not those of its twenty neighbours;
- the header of a compound statement (an `if`/`elif`/`while` test, a `for` target and iterable,
  `with` items, a `match` subject, an `except` type): the whole header, and it encloses its
  body and else-branches (everything under `if self.need_mamba_block_aligned_split:`);
- the function's name and its class's name: `Scheduler._mamba_block_aligned_split`,
  `MambaManager.*` and `HybridKVCacheCoordinator.*` are kept whole.

The words are the names vLLM 0.32 gives to align mode's parts (docs/MUTATION.md lists what
they select): the mamba group and its split, EAGLE/MTP (`eagle`, `lookahead`, `reprefill`),
checkpoints, sparse retention and the shared-prefix junction, hybrid coordination, partial
hash hits, copy-on-write and boundary-state hand-off; and the token accounting that decides
which state a slot holds after a rejected draft or a preemption and which blocks a request may
free (`prefill_end`, `rejected`, `num_in_flight`, `stale`).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

WORDS: tuple[str, ...] = (
    "mamba", "align", "eagle", "hybrid", "checkpoint", "lookahead", "reprefill", "retention",
    "shared_prefix", "uncached", "boundar", "partial_hash", "cow", "block_copies",
    "prefill_end", "rejected", "num_in_flight", "stale",
)
RULE = "mamba-statements/1:" + ",".join(WORDS)  # part of a filtered function's digest
_WORD = re.compile("|".join(WORDS), re.IGNORECASE)



@cache
def _headers() -> dict[type, tuple[str, ...]]:
    """The header parts of a compound statement (its body and else-branches are what it encloses).
    libcst comes with mutmut (the `mutation` extra), so it is imported only when mutants are made."""
    import libcst as cst

    return {cst.If: ("test",), cst.While: ("test",), cst.For: ("target", "iter"), cst.With: ("items",),
            cst.Match: ("subject",), cst.MatchCase: ("pattern", "guard"), cst.ExceptHandler: ("type",),
            cst.ExceptStarHandler: ("type",)}


def names_mamba(*identifiers: str) -> bool:
    return any(_WORD.search(i) for i in identifiers)


def whole(class_name: str, function_name: str) -> bool:
    """A function kept whole: its own or its class's name names align mode."""
    return names_mamba(class_name, function_name)


def _identifiers(node: Any, skip_args: bool = False) -> list[str]:
    import libcst as cst

    out: list[str] = []

    class Names(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            if skip_args and isinstance(n, cst.Arg):
                return False
            if isinstance(n, cst.Name):
                out.append(n.value)
            return True
    node.visit(Names())
    return out


def _unit(node: Any, parents) -> list[str] | None:
    """The identifiers by which `node` judges what it holds, or None when it is no unit."""
    import libcst as cst

    if isinstance(node, cst.Arg):
        call = parents.get(node)
        return _identifiers(node) + (_identifiers(call.func) if isinstance(call, cst.Call) else [])
    if isinstance(node, cst.Param):
        return _identifiers(node)
    if isinstance(node, cst.SimpleStatementLine | cst.BaseSmallStatement):
        return _identifiers(node, skip_args=True)
    if isinstance(node, cst.FunctionDef | cst.ClassDef):
        return [node.name.value]
    for kind, parts in _headers().items():
        if isinstance(node, kind):
            found: list[str] = []
            for part in parts:
                value = getattr(node, part)
                for v in value if isinstance(value, list | tuple) else (value,):
                    if v is not None:
                        found += _identifiers(v)
            return found
    return None


def _changed_args(original: Any, mutated: Any) -> list[Any]:
    """The arguments a call mutation drops or replaces (mutmut keeps the others as they are)."""
    import libcst as cst

    if not (isinstance(original, cst.Call) and isinstance(mutated, cst.Call)):
        return []
    kept = {id(a) for a in mutated.args}
    return [a for a in original.args if id(a) not in kept]


def concerns_mamba(node: Any, parents, changed_args: list[Any] = ()) -> bool:
    """Does the rule keep a mutation of `node` (of a function not kept whole)?"""
    if changed_args:
        return any(concerns_mamba(a, parents) for a in changed_args)
    while node is not None:
        found = _unit(node, parents)
        if found is not None and names_mamba(*found):
            return True
        node = parents.get(node)
    return False


def select(wrapper: Any, mutations: list) -> list:
    """The mutations (mutmut's, made by visiting `wrapper`) the rule keeps, in visit order."""
    from libcst.metadata import ParentNodeProvider

    parents = wrapper.resolve(ParentNodeProvider)
    return [m for m in mutations if concerns_mamba(m.original_node, parents,
                                                   _changed_args(m.original_node, m.mutated_node))]

