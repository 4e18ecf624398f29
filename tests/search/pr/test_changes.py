"""The PR job's one-change grouping: counting the changes between the PR's vLLM and its base,
and joining every new finding when there is one."""

from pathlib import Path

from mambafuzz.search.pr import changes
from mambafuzz.sim.patching import Rewrite, Wrap
from mambafuzz.tools.mutation.planting import MUTANT_ENV

SOURCE = "def f(x):\n    a = x + 1\n    b = a * 2\n    c = b - 3\n    d = c // 4\n    return d\n"


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_planted_patch_counts_each_edit_and_a_wrapper_once():
    assert changes.patch_changes([Rewrite("m:f", (("a", "b"),))]) == 1
    assert changes.patch_changes([Rewrite("m:f", (("a", "b"), ("c", "d")))]) == 2
    assert changes.patch_changes([Wrap("m:f", lambda orig: orig)]) == 1
    assert changes.patch_changes([]) == 0


def test_trees_count_their_hunks(tmp_path):
    base = tree(tmp_path / "base", {"core/a.py": SOURCE, "core/b.py": SOURCE})
    assert changes.tree_changes(tree(tmp_path / "same", {"core/a.py": SOURCE, "core/b.py": SOURCE}), base) == 0
    assert changes.tree_changes(base, base) == 0
    one = SOURCE.replace("a * 2", "a * 3")
    assert changes.tree_changes(tree(tmp_path / "one", {"core/a.py": one, "core/b.py": SOURCE}), base) == 1
    two = one.replace("c // 4", "c // 5")  # a second edit, lines apart: a second hunk
    assert changes.tree_changes(tree(tmp_path / "two", {"core/a.py": two, "core/b.py": SOURCE}), base) == 2
    added = tree(tmp_path / "added", {"core/a.py": SOURCE, "core/b.py": SOURCE, "core/new.py": "x = 1\n"})
    assert changes.tree_changes(added, base) == 1
    assert changes.tree_changes(added, tmp_path / "two") == 2  # two files differ: at least two changes


def test_a_generated_mutant_on_the_installed_vllm_is_one_change(monkeypatch):
    """The PR job on a planted mutant with the installed vLLM as base: the trees are the same
    directory, the mutant one change."""
    monkeypatch.setenv(MUTANT_ENV, "mm:MambaManager.pop_blocks_for_free:19")
    assert changes.changes_against("installed") == 1
    monkeypatch.delenv(MUTANT_ENV)
    assert changes.changes_against("installed") == 0


def test_one_change_joins_every_group_in_discovery_order():
    def member(name, why="root"):
        return {"path": name, "signature": "s", "fine_signature": "f", "why": why}

    groups = [{"root": "a", "members": [member("a"), member("b", "mechanism")]},
              {"root": "c", "members": [member("c")]}, {"root": "d", "members": [member("d")]}]
    (joined,) = changes.one_group(groups)
    assert joined["root"] == "a" and joined["cause"]
    assert [(m["path"], m["why"]) for m in joined["members"]] == [
        ("a", "root"), ("b", "mechanism"), ("c", "one change"), ("d", "one change")]
    assert changes.one_group(groups[:1]) == groups[:1]


def test_a_base_whose_tree_cannot_be_found_concludes_nothing(monkeypatch):
    monkeypatch.setattr(changes, "base_package_dir", lambda where: None)
    monkeypatch.setenv(MUTANT_ENV, "mm:MambaManager.pop_blocks_for_free:19")
    assert changes.changes_against("installed") == changes.MANY


def test_the_time_goes_mostly_where_the_pr_changes_code():
    worker = ["v1/worker/gpu_model_runner.py", "model_executor/layers/mamba/mamba_utils.py"]
    scheduler = ["v1/core/sched/scheduler.py"]
    sched, conform, why = changes.time_split(worker, 100)
    assert (sched, conform) == (20, 80) and why.startswith("worker")
    assert changes.time_split(scheduler, 100)[:2] == (85, 15)
    assert changes.time_split(worker + scheduler, 100)[:2] == (60, 40)
    assert changes.time_split(None, 100)[:2] == (60, 40)  # the base's tree cannot be found
    assert changes.time_split([], 100)[:2] == (60, 40)  # nothing differs: no side to favour


def test_a_planted_mutant_names_the_file_it_changes(monkeypatch):
    monkeypatch.setenv(MUTANT_ENV, "table_first_allocation_rerun")
    assert changes.changed_paths("installed") == ["v1/core/single_type_kv_cache_manager.py"]
    monkeypatch.setattr(changes, "base_package_dir", lambda where: None)
    assert changes.changed_paths("installed") is None


def test_the_split_command_prints_one_line(capsys):
    assert changes.main(["split", "installed", "60"]) == 0
    sched, conform, why = capsys.readouterr().out.split(" ", 2)
    assert int(sched) + int(conform) == 60 and why.strip()
    assert changes.main(["split", "installed"]) == 2
