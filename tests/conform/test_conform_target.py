"""`mambafuzz fuzz --target conform`: the kernel model against vLLM's own worker code as a fuzz
target (mambafuzz/conform/target.py): it runs on each runner, finds a planted mirror bug, files it as
a case `mambafuzz conform` reproduces, and a campaign that checked nothing is a tool failure."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mambafuzz.cli.main import main
from mambafuzz.conform import target as conform_target
from mambafuzz.sim.worker.kernel_model import KernelModel
from mambafuzz.store.corpus import load_case

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "corpus" / "seeds" / "shared_prefix_block_hits.json"

# A planted mirror bug: the kernel model forgets the pre-forward copy of a row whose running
# column moves (preprocess_mamba's copy, mamba_utils.py), on both runners and mixers.
PLANT = '''
from mambafuzz.sim.patching import Wrap


def _no_precopy(run_row):
    def run_row_without_precopy(self, *args, **kwargs):
        res = run_row(self, *args, **kwargs)
        return res._replace(writes=[w for w in res.writes if w[3] != "precopy"])
    return run_row_without_precopy


PATCHES = [Wrap("mambafuzz.sim.worker.kernel_model:KernelModel.run_row", _no_precopy)]
'''

# Every input refused as vLLM refuses a config: the campaign executes nothing.
REFUSE_ALL = '''
from mambafuzz.sim.bridge import configs
from mambafuzz.sim.patching import Wrap


def _refuse(compare):
    def refuse(*args, **kwargs):
        raise configs.ConfigRejected("planted: every config refused")
    return refuse


PATCHES = [Wrap("mambafuzz.conform.compare:compare", _refuse)]
'''


def mambafuzz(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "mambafuzz.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def conform_campaign(tmp_path: Path, *flags: str, seeds: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return mambafuzz("fuzz", "--target", "conform", "--generator", "random", "--corpus", str(tmp_path / "corpus"),
                     "--seeds", *seeds, "--known", "--findings", str(tmp_path / "findings"), *flags, cwd=tmp_path)


def executions(stdout: str) -> int:
    line = next(x for x in stdout.splitlines() if x.startswith("summary: "))
    return int(line.split()[1])


def test_a_disagreement_is_signed_by_its_first_differing_field_mixer_and_runner(monkeypatch):
    scenario = load_case(SEED).scenario
    assert conform_target.verdict(scenario, ("v1", "v2")) is None
    monkeypatch.setattr(KernelModel, "run_row", _without_precopy(KernelModel.run_row))
    v = conform_target.verdict(scenario, ("v2",))
    sig = v.signature
    assert sig == "conform:precopy/gdn@v2" and v.fine_signature is None, v.message
    assert conform_target.runner_of(sig) == "v2"


def _without_precopy(run_row):
    def run_row_without_precopy(self, *args, **kwargs):
        res = run_row(self, *args, **kwargs)
        return res._replace(writes=[w for w in res.writes if w[3] != "precopy"])
    return run_row_without_precopy


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_the_conform_target_runs_on_each_runner_and_counts_its_executions(tmp_path, runner):
    # V1 synchronous: under async it reaches vllm-project/vllm#51571's open family (docs/CONFORMANCE.md)
    scheduling = ("--scheduling", "sync") if runner == "v1" else ()
    proc = conform_campaign(tmp_path, "--runner", runner, *scheduling, "--runs", "12", "--max-time", "300")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"vLLM's worker code on {runner}" in proc.stdout
    assert executions(proc.stdout) > 0, proc.stdout[-2000:]
    assert not list((tmp_path / "findings").glob("*.json"))


def test_a_planted_mirror_bug_is_filed_minimized_and_replayed_by_mambafuzz_conform(tmp_path, capsys):
    plant = tmp_path / "plant.py"
    plant.write_text(PLANT)
    proc = conform_campaign(tmp_path, "--runner", "v1", "--max-time", "120", "--stop-on-first",
                            "--minimize-budget", "20", "--patch", str(plant))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    files = sorted((tmp_path / "findings").glob("conform-*.json"))
    assert len(files) == 1, proc.stdout[-2000:]
    meta = json.loads(files[0].read_text())["finding"]
    assert meta["signature"].startswith("conform:precopy/") and meta["signature"].endswith("@v1")
    assert meta["reproduced"] == "3/3" and meta["target"] == "conform"
    assert meta["repro"] == f"mambafuzz conform {files[0]} --runner v1 --patch {plant}"
    assert f"repro: {meta['repro']}" in proc.stdout
    assert main(["conform", str(files[0]), "--runner", "v1", "--patch", str(plant)]) == 1
    assert f"DISAGREE {meta['signature']}" in capsys.readouterr().out
    assert main(["conform", str(files[0]), "--runner", "v1"]) == 0  # the disagreement is the plant's


def test_a_conform_campaign_that_checked_nothing_is_a_tool_failure(tmp_path):
    refuse = tmp_path / "refuse.py"
    refuse.write_text(REFUSE_ALL)
    proc = conform_campaign(tmp_path, "--max-time", "4", "--patch", str(refuse), seeds=(str(ROOT / "corpus" / "seeds"),))
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "executed no input" in proc.stderr
    assert executions(proc.stdout) == 0


def test_target_is_validated_and_explained(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fuzz", "--target", "nope", "--max-time", "1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--target" in err and "nope" in err and len(err.splitlines()) == 1
    assert main(["fuzz", "--target", "conform", "--split", "prefix", "--max-time", "1"]) == 2
    assert "--split does not apply" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fuzz", "--help"])
    assert "conform:<field>/<mixer>@<runner>" in " ".join(capsys.readouterr().out.split())
