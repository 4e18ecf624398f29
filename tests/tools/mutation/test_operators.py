"""Generated mutants (mambafuzz.tools.mutation.operators): made from the installed vLLM, applied and
restored in one process, planted in a fresh process by MAMBAFUZZ_MUTANT, and a kill is
confirmed only by a scenario that fails with the mutant and is clean without it."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mambafuzz.sim import patching
from mambafuzz.store import corpus
from mambafuzz.tools.mutation import kills, planting, statements
from mambafuzz.tools.mutation import operators as mt

ROOT = Path(__file__).resolve().parents[3]
SPLIT = "mm:Scheduler._mamba_block_aligned_split"
CASE = ROOT / "tests" / "data" / "mutant_split_chunk_end_plus_start.json"
# The targets mutated only where they concern align mode (issue 21: the large functions).
FILTERED_GROUPS = ["coordinator", "allocate_slots", "get_computed_blocks", "schedule", "update_from_output"]


def split_mutant(change: str) -> mt.Mutant:
    """The split mutant whose change is `change` (ids are looked up by what they do, so this
    test says which mutation it means even if mutmut's numbering moves)."""
    found = [m for m in mt.list_mutants(["split"]) if m.change == change]
    assert len(found) == 1, [m.change for m in mt.list_mutants(["split"])]
    return found[0]


def test_every_mutant_of_every_group_applies_with_a_unique_id():
    every = mt.list_mutants(list(mt.GROUPS))
    assert len({m.id for m in every}) == len(every)
    assert len([m for m in every if m.id.startswith(SPLIT + ":")]) >= 100
    assert {m.target.rpartition(".")[2] for m in every} >= {"find_longest_cache_hit", "cache_blocks", "__init__",
                                                            "schedule", "update_from_output", "allocate_slots",
                                                            "get_computed_blocks"}
    for m in every:
        assert mt.find(m.id) == m
        assert m.source != mt.function_source(m.target)[0], m.id
        assert patching.check_applies(planting.patches(m.id)) is None, m.id


def test_a_mutant_replaces_the_method_and_is_restored():
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.__dict__["_mamba_block_aligned_split"]
    m = split_mutant("- return max(end - start, 0) | + return max(end + start, 0)")
    with patching.applied(planting.patches(m.id)):
        planted = Scheduler.__dict__["_mamba_block_aligned_split"]
        assert planted is not original
        # vLLM's file and line numbers, so crash locations point into vLLM's source
        assert planted.__code__.co_filename == original.__code__.co_filename
        assert planted.__code__.co_firstlineno == original.__code__.co_firstlineno
        assert planted.__module__ == original.__module__
    assert Scheduler.__dict__["_mamba_block_aligned_split"] is original


SOURCE = """\
def schedule(self, request):
    n = request.num_tokens
    if self.need_mamba_block_aligned_split:
        n = self._mamba_block_aligned_split(request, n)
        if n == 0:
            return 0
    total = n + 1
    out = Output(tokens=total, kv_cache_block_copies=self.copies)
    self.allocate(request, total, num_lookahead_tokens=self.k)
    return out
"""


def test_the_rule_keeps_the_mutations_of_mamba_statements_only():
    """Statements, enclosing headers and call arguments are judged by the identifiers they name."""
    _, wrapper, every = mt.visit(SOURCE)
    kept = {id(m) for m in statements.select(wrapper, every)}
    code = wrapper.module.code_for_node
    old = SOURCE.splitlines()
    by_line: dict[str, set[bool]] = {}
    for m in every:
        new = wrapper.module.deep_replace(m.original_node, m.mutated_node).code.splitlines()
        line = next(o for o, n in zip(old, new) if o != n).strip()
        by_line.setdefault(line, set()).add(id(m) in kept)
    assert by_line["n = request.num_tokens"] == {False}
    assert by_line["n = self._mamba_block_aligned_split(request, n)"] == {True}  # the callee names it
    assert by_line["if n == 0:"] == {True}  # inside `if self.need_mamba_block_aligned_split:`
    assert by_line["return 0"] == {True}
    assert by_line["total = n + 1"] == {False}

    def calls(callee: str) -> dict[str, bool]:
        return {code(m.mutated_node): id(m) in kept for m in every if code(m.original_node).startswith(callee)}
    # one argument names a mamba word: its mutations are kept, its neighbours' are not
    assert calls("Output(") == {"Output(tokens=None, kv_cache_block_copies=self.copies)": False,
                                "Output(tokens=total, kv_cache_block_copies=None)": True,
                                "Output(kv_cache_block_copies=self.copies)": False,
                                "Output(tokens=total, )": True}
    alloc = calls("self.allocate(")
    assert alloc["self.allocate(request, total, )"] is True  # num_lookahead_tokens dropped
    assert alloc["self.allocate(request, num_lookahead_tokens=self.k)"] is False
    assert alloc["self.allocate(request, total, num_lookahead_tokens=None)"] is True


def test_large_functions_are_filtered_and_mamba_classes_kept_whole():
    for group in FILTERED_GROUPS:
        targets = mt.expand([group])
        assert sum(len(mt.mutants_of(t)) for t in targets) > 0, group
    schedule = mt.expand(["schedule"])[0]
    assert 0 < len(mt.mutants_of(schedule)) < mt.count_all(schedule) / 4
    assert any("_mamba_block_aligned_split" in text for _, _, text in mt.statements(schedule))
    # the split and MambaManager keep every mutation, so their ids and digests are what they were
    for t in mt.expand(["split", "MambaManager"]) + mt.expand(["coordinator"])[:1]:
        assert mt.kept_whole(t) and len(mt.mutants_of(t)) == mt.count_all(t), t
        assert mt.digest(t) == hashlib.sha256(mt.function_source(t)[0].encode()).hexdigest()[:12]
    # a filtered function's ids depend on the rule too: its digest names it
    assert mt.digest(schedule) != hashlib.sha256(mt.function_source(schedule)[0].encode()).hexdigest()[:12]


def test_the_coordinator_group_is_what_a_hybrid_coordinator_runs():
    """Base methods the hybrid coordinator overrides never run; its `__init__` reaches the base's."""
    names = {t.partition(":")[2] for t in mt.expand(["coordinator"])}
    assert {"HybridKVCacheCoordinator.find_longest_cache_hit", "KVCacheCoordinator.__init__",
            "KVCacheCoordinator.cache_blocks", "HybridKVCacheCoordinator.__init__"} <= names
    assert "KVCacheCoordinator.get_num_cacheable_tokens" not in names
    assert "KVCacheCoordinator.find_longest_cache_hit" not in names


def test_planting_each_new_target_unmutated_changes_no_trace():
    """The identity application of every filtered target (compiled in a class body under vLLM's
    file, globals and line numbers, `__class__` bound) replays seeds exactly as vLLM does."""
    from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinator
    from vllm.v1.core.sched.scheduler import Scheduler

    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.store.report import trace_digest

    targets = mt.expand(FILTERED_GROUPS)
    plants = [p for t in targets for p in mt.planting(mt.identity(t))]
    seeds = ["async_mtp_rejected_drafts_in_flight", "connector_divergent_hybrid_hits", "sparse_retention_interval",
             "preemption_small_pool_mtp", "shared_prefix_checkpoint_mtp"]
    for name in seeds:
        sc = corpus.load_case(ROOT / "corpus" / "seeds" / f"{name}.json").scenario
        native = evaluate(sc, "fixed", efficiency=False)
        planted = evaluate(sc, "fixed", efficiency=False, patches=plants)
        assert trace_digest(planted.trace) == trace_digest(native.trace), name
        assert (planted.uncached is None) == (native.uncached is None), name
        if native.uncached is not None:
            assert trace_digest(planted.uncached) == trace_digest(native.uncached), name
        assert [f.signature for f in planted.verdict.findings] == [f.signature for f in native.verdict.findings]
    original = Scheduler.__dict__["schedule"]
    with patching.applied(plants):
        assert Scheduler.__dict__["schedule"] is not original
        assert Scheduler.__dict__["schedule"].__code__.co_firstlineno == original.__code__.co_firstlineno
        assert KVCacheCoordinator.__dict__["__init__"].__code__.co_filename == original.__code__.co_filename.replace(
            "sched/scheduler.py", "kv_cache_coordinator.py")


def test_private_names_are_mangled_as_in_the_class():
    """`self.__x` in a method means `self._Owner__x`: compiled outside a class body it would not."""
    class Owner:
        def __init__(self):
            self.__secret = 41

        def peek(self):
            return self.__secret

    src = "def peek(self):\n    return self.__secret + 1\n"
    fn = mt.compile_method(src, Owner, "peek", 1, __file__, globals())
    assert fn(Owner()) == 42


def test_the_list_says_what_the_rule_kept(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutation_run", ROOT / "bench" / "mutation_run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    run.print_list(mt, ["get_computed_blocks"], [], True)
    out = capsys.readouterr().out
    t = mt.expand(["get_computed_blocks"])[0]
    assert "KVCacheManager.get_computed_blocks" in out and f"of {mt.count_all(t):4} (mamba statements" in out
    assert "shared_prefix_boundary" in out  # a line the rule selected, from vLLM's file


def test_a_rewriting_fix_edits_the_mutant_not_the_file():
    """inspect would hand a Rewrite vLLM's unmutated lines; the mutant's own text must be used."""
    m = split_mutant("- return max(end - start, 0) | + return max(end + start, 0)")
    undo = patching.Rewrite(patching.SPLIT_TARGET, (("return max(end - start, 0)", "return 0"),))
    with patching.applied(planting.patches(m.id)):
        assert patching.check_applies([undo]) is not None  # the text it edits is gone in the mutant
        keep = patching.Rewrite(patching.SPLIT_TARGET, (("return max(end + start, 0)", "return max(end + start, 1)"),))
        assert patching.check_applies([keep]) is None


def test_zero_argument_super_still_works_in_a_mutated_method():
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager

    m = next(m for m in mt.list_mutants(["MambaManager.__init__"]))
    fn = mt.compile_mutant(m)
    assert "__class__" in fn.__code__.co_freevars
    assert fn.__closure__[fn.__code__.co_freevars.index("__class__")].cell_contents is MambaManager


def test_kill_is_attributed_only_with_the_mutant_and_a_clean_baseline():
    case = corpus.load_case(CASE)
    killer = split_mutant("- return max(end - start, 0) | + return max(end + start, 0)")
    ok, why = kills.confirms_kill(case.scenario, "fixed", killer.id, case.extra["finding"]["signature"])
    assert ok, why
    # the default of an argument every caller passes: this scenario cannot tell it apart
    default = split_mutant("- num_external_computed_tokens: int = 0, | + num_external_computed_tokens: int = 1,")
    ok, why = kills.confirms_kill(case.scenario, "fixed", default.id)
    assert not ok and "clean with the mutant" in why


@pytest.mark.parametrize("bad", ["mm:Scheduler._mamba_block_aligned_split:99999", "mm:Nope.f:1", "mm:x", "mm:Scheduler.nope:0"])
def test_a_bad_mutant_id_is_one_line(bad):
    with pytest.raises((mt.MutantError, patching.FixNotApplicable)) as info:
        planting.patches(bad)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("group", ["split", "schedule", "coordinator"])
def test_mambafuzz_mutant_plants_a_generated_mutant_in_a_fresh_process(group):
    """What a fuzz worker does at start-up: its start-up step (mambafuzz.search.startup) plants
    MAMBAFUZZ_MUTANT; importing the bridge (or anything else) plants nothing. For the coordinator,
    a base-class method: the hybrid coordinator inherits the planted one."""
    if group == "split":
        m = split_mutant("- return max(end - start, 0) | + return max(end + start, 0)")
    else:
        m = next(m for m in mt.list_mutants([group]) if m.target.split(":")[1].split(".")[0] in ("Scheduler", "KVCacheCoordinator")
                 and not m.target.endswith("__init__"))
    module, qual = m.target.split(":")
    cls, fn = qual.split(".")
    owner = "HybridKVCacheCoordinator" if group == "coordinator" else cls
    code = ("import mambafuzz.sim.bridge.scheduler_session, mambafuzz.checks.pipeline, mambafuzz.search.target_runtime\n"
            "from mambafuzz.tools.mutation import operators as mt\n"
            f"from {module} import {owner}\n"
            f"mutant = mt.compile_mutant(mt.find({m.id!r}))\n"
            "same = lambda f: (f.__code__.co_code, f.__defaults__, f.__kwdefaults__)\n"
            f"planted = lambda: same({owner}.{fn}) == same(mutant)\n"
            "print(planted())\n"
            "from mambafuzz.search.startup import prepare_process\n"
            "prepare_process()\n"
            "print(planted())\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, MAMBAFUZZ_MUTANT=m.id))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-2:] == ["False", "True"]
