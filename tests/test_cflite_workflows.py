"""The ClusterFuzzLite workflow templates (ci/cflite-*.yml, copied to .github/workflows/): each
parses, runs the mode its name claims on a build of the language and sanitizer it runs, and
names the storage repository that carries the corpus between runs and runners."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MODES = {"pr": "code-change", "batch": "batch", "prune": "prune", "coverage": "coverage"}
BUILD, RUN = "google/clusterfuzzlite/actions/build_fuzzers@v1", "google/clusterfuzzlite/actions/run_fuzzers@v1"


def test_there_is_one_workflow_per_mode():
    assert sorted(p.name for p in (ROOT / "ci").glob("cflite-*.yml")) == sorted(f"cflite-{n}.yml" for n in MODES)


@pytest.mark.parametrize("name", sorted(MODES))
def test_the_workflow_runs_the_mode_its_name_claims(name):
    workflow = yaml.safe_load((ROOT / "ci" / f"cflite-{name}.yml").read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert ("pull_request" in triggers) == (name == "pr")
    assert name == "pr" or "schedule" in triggers
    language = yaml.safe_load((ROOT / ".clusterfuzzlite" / "project.yaml").read_text())["language"]
    (job,) = workflow["jobs"].values()
    steps = job["steps"]
    assert [s.get("uses") for s in steps] == [BUILD, RUN]
    build, run = steps[0]["with"], steps[1]["with"]
    assert run["mode"] == MODES[name]
    assert build["language"] == language
    sanitizer = "coverage" if name == "coverage" else "address"
    assert build.get("sanitizer", "address") == run.get("sanitizer", "address") == sanitizer
    assert "${{ vars.CFLITE_STORAGE_REPO }}" in run["storage-repo"]
    assert int(run["fuzz-seconds"]) > 0 and job["timeout-minutes"] * 60 > int(run["fuzz-seconds"])
    # only the modes that push to the storage repository get its token (a fork's PR gets no secrets)
    assert ("secrets.CFLITE_STORAGE_TOKEN" in run["storage-repo"]) == (name != "pr")
