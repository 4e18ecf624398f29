"""Generated mutants (mambafuzz.tools.mutation): made from the installed vLLM, applied and
restored in one process, planted in a fresh process by MAMBAFUZZ_MUTANT, and a kill is
confirmed only by a scenario that fails with the mutant and is clean without it."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mambafuzz.search import mutants
from mambafuzz.sim import patching
from mambafuzz.store import corpus
from mambafuzz.tools import mamba_statements
from mambafuzz.tools import mutation as mt

ROOT = Path(__file__).resolve().parents[2]
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
        assert patching.check_applies(mutants.patches(m.id)) is None, m.id


def test_a_mutant_replaces_the_method_and_is_restored():
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.__dict__["_mamba_block_aligned_split"]
    m = split_mutant("- return max(end - start, 0) | + return max(end + start, 0)")
    with patching.applied(mutants.patches(m.id)):
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
    kept = {id(m) for m in mamba_statements.select(wrapper, every)}
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
    with patching.applied(mutants.patches(m.id)):
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
    ok, why = mutants.confirms_kill(case.scenario, "fixed", killer.id, case.extra["finding"]["signature"])
    assert ok, why
    # the default of an argument every caller passes: this scenario cannot tell it apart
    default = split_mutant("- num_external_computed_tokens: int = 0, | + num_external_computed_tokens: int = 1,")
    ok, why = mutants.confirms_kill(case.scenario, "fixed", default.id)
    assert not ok and "clean with the mutant" in why


@pytest.mark.parametrize("bad", ["mm:Scheduler._mamba_block_aligned_split:99999", "mm:Nope.f:1", "mm:x", "mm:Scheduler.nope:0"])
def test_a_bad_mutant_id_is_one_line(bad):
    with pytest.raises((mt.MutantError, patching.FixNotApplicable)) as info:
        mutants.patches(bad)
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
            "from mambafuzz.tools import mutation as mt\n"
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


def test_a_survivor_classified_on_another_source_is_stale():
    """bench/mutation_run.py reuses a hand classification only for the source it was made on."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutation_run", ROOT / "bench" / "mutation_run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    classes = {"mm:X.f:1": {"digest": "abc", "class": "equivalent"}}
    row = {"id": "mm:X.f:1", "status": "survived", "digest": "abc"}
    assert run.classify(row, classes) == "equivalent"
    assert run.classify({**row, "digest": "other"}, classes) == "stale"
    assert run.classify({**row, "id": "mm:X.f:2"}, classes) == "unclassified"
    assert run.classify({**row, "status": "killed"}, classes) == "killed"
    on_disk = run.load_classes()
    assert on_disk and all(c["class"] in ("equivalent", "efficiency", "unreachable", "missed") and c["why"]
                           for c in on_disk.values())


def test_the_fork_server_kills_a_crashing_mutant_and_keeps_its_parent_clean(tmp_path):
    """bench/mutation_run.py --fork-server: each campaign is a child forked from one process that
    imported vLLM once. A mutant that crashes at the first input is killed (attributed in a
    second child), an equivalent one is not killed, and the parent, which forked both, still runs
    vLLM's own split."""
    split = "mm:Scheduler._mamba_block_aligned_split"
    code = (
        "import sys; sys.path.insert(0, 'bench')\n"
        "import mutation_forkserver as fs, mutation_run as mr\n"
        "from vllm.v1.core.sched.scheduler import Scheduler\n"
        "before = Scheduler._mamba_block_aligned_split\n"
        "fs.warm()\n"
        f"rows = dict(fs.run(['{split}:2', '{split}:107'], max_time=2, minimize_budget=1, known=mr.KNOWN,\n"
        "                    keep=None, parallel=2, hidden=lambda *a: None))\n"
        "print(rows['" + split + ":2']['status'], rows['" + split + ":107']['status'],\n"
        "      Scheduler._mamba_block_aligned_split is before)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MAMBAFUZZ_MUTANT"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    crashing, equivalent, parent_clean = out.stdout.split()[-3:]
    # Unmodified vLLM 0.32 has findings within reach of a 2-second campaign since pools go down to its
    # start-up minimum (corpus/untriaged): the equivalent mutant's campaign may stop on one, which its
    # confirmation replay then refuses to count (unconfirmed). Either way it is not killed.
    assert (crashing, parent_clean) == ("killed", "True")
    assert equivalent in ("survived", "unconfirmed")


def test_replaying_survivors_counts_the_cases_that_raise_with_the_mutant(monkeypatch, tmp_path):
    """A case the unmutated vLLM runs but that raises with the mutant (a tool failure) is counted and
    named in the evidence, never dropped silently: a dropped one hid a kill (schedule() returning None)."""
    import importlib.util
    import shutil

    from mambafuzz.checks import pipeline

    spec = importlib.util.spec_from_file_location("mutation_run", ROOT / "bench" / "mutation_run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    seeds = sorted((ROOT / "corpus" / "seeds").glob("*.json"))[:2]
    for path in seeds:
        shutil.copy(path, tmp_path / path.name)
    real = pipeline.evaluate

    def evaluate(scenario, split, **kwargs):
        if kwargs.get("patches") == ["MUTANT"]:
            raise RuntimeError("the harness met a state it cannot judge")
        return real(scenario, split, **kwargs)

    monkeypatch.setattr(pipeline, "evaluate", evaluate)
    monkeypatch.setattr(mutants, "patches", lambda mutant_id: ["MUTANT"])
    out = run.replay_survivors([{"id": "m:0", "status": "survived", "change": "x"}], [str(tmp_path)])
    e = out["m:0"]
    assert e["raised"] == 2 and e["cases"] == 0 and "cannot judge" in e["raised_first"]


def test_a_rerun_of_survivors_supersedes_their_first_rows_in_the_combined_table(tmp_path):
    """--table-from: a mutant's last row counts (a re-run on an unchanging checkout replaces a
    survivor of a run whose checkout changed), other generators' and functions' rows are left out."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("mutation_run", ROOT / "bench" / "mutation_run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    row = {"generator": "random", "function": "F.f", "max_time": 15}
    first, rerun = tmp_path / "first.jsonl", tmp_path / "rerun.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in [
        {**row, "id": "m:0", "status": "survived"}, {**row, "id": "m:1", "status": "killed"},
        {**row, "id": "m:2", "status": "survived", "generator": "atheris"},
        {**row, "id": "m:3", "status": "survived", "function": "G.g"}]))
    rerun.write_text(json.dumps({**row, "id": "m:0", "status": "killed", "max_time": 10}) + "\n")
    got = run.last_row_per_mutant([str(first), str(rerun)], "random", {"F.f"})
    assert [(r["id"], r["status"], r["max_time"]) for r in got] == [("m:1", "killed", 15), ("m:0", "killed", 10)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "m:0"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: not a mutation_run row"):
        run.last_row_per_mutant([str(bad)], "random", {"F.f"})
