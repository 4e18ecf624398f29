"""Generated mutants (mambafuzz.tools.mutation): made from the installed vLLM, applied and
restored in one process, planted in a fresh process by MAMBAFUZZ_MUTANT, and a kill is
confirmed only by a scenario that fails with the mutant and is clean without it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mambafuzz.search import mutants
from mambafuzz.sim import patching
from mambafuzz.store import corpus
from mambafuzz.tools import mutation as mt

ROOT = Path(__file__).resolve().parents[2]
SPLIT = "mm:Scheduler._mamba_block_aligned_split"
CASE = ROOT / "tests" / "data" / "mutant_split_chunk_end_plus_start.json"


def split_mutant(change: str) -> mt.Mutant:
    """The split mutant whose change is `change` (ids are looked up by what they do, so this
    test says which mutation it means even if mutmut's numbering moves)."""
    found = [m for m in mt.list_mutants(["split"]) if m.change == change]
    assert len(found) == 1, [m.change for m in mt.list_mutants(["split"])]
    return found[0]


def test_every_mutant_of_the_split_and_the_manager_applies_with_a_unique_id():
    every = mt.list_mutants(["split", "MambaManager"])
    assert len({m.id for m in every}) == len(every)
    assert len([m for m in every if m.id.startswith(SPLIT + ":")]) >= 100
    assert {m.target.rpartition(".")[2] for m in every} >= {"find_longest_cache_hit", "cache_blocks", "__init__"}
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


def test_mambafuzz_mutant_plants_a_generated_mutant_in_a_fresh_process():
    """What a fuzz worker does at start-up: its start-up step (mambafuzz.search.startup) plants
    MAMBAFUZZ_MUTANT; importing the bridge (or anything else) plants nothing."""
    m = split_mutant("- return max(end - start, 0) | + return max(end + start, 0)")
    code = ("import mambafuzz.sim.vllm_bridge, mambafuzz.checks.pipeline, mambafuzz.search.target_runtime\n"
            "from mambafuzz.tools import mutation as mt\n"
            "from vllm.v1.core.sched.scheduler import Scheduler\n"
            f"mutant = mt.compile_mutant(mt.find({m.id!r}))\n"
            "planted = lambda: Scheduler._mamba_block_aligned_split.__code__.co_code == mutant.__code__.co_code\n"
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
