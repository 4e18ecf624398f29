"""Replays of cases against a mutant (mambafuzz.tools.mutation.kills), as bench/mutation_run.py
--replay-survivors runs them."""

from pathlib import Path

from mambafuzz.tools.mutation import planting

ROOT = Path(__file__).resolve().parents[3]


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
    monkeypatch.setattr(planting, "patches", lambda mutant_id: ["MUTANT"])
    out = run.replay_survivors([{"id": "m:0", "status": "survived", "change": "x"}], [str(tmp_path)])
    e = out["m:0"]
    assert e["raised"] == 2 and e["cases"] == 0 and "cannot judge" in e["raised_first"]
