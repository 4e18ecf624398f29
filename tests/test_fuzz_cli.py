"""`mambafuzz fuzz`, `minimize` and `corpus` end to end (short, bounded runs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.cli import main
from fuzz.generate import random_scenario
from tests.conftest import first_chunk_scenario


def mambafuzz(*args, cwd, timeout=240):
    return subprocess.run([sys.executable, "-m", "fuzz.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_random_engine_finds_the_prefix_bug_from_an_empty_corpus_and_files_it_minimized(tmp_path):
    proc = mambafuzz("fuzz", "--split", "prefix", "--engine", "random", "--max-time", "60", "--stop-on-first",
                     "--corpus", str(tmp_path / "corpus"), "--seeds", "--known", "--findings",
                     str(tmp_path / "findings"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    files = sorted((tmp_path / "findings").glob("*.json"))
    assert len(files) == 1 and "FOUND" in proc.stdout and "repro: mambafuzz repro" in proc.stdout
    case = json.loads(files[0].read_text())
    assert case["finding"]["origin"]["input"] == "random"  # generated, not a seed
    assert case["finding"]["reproduced"] == "3/3"
    assert len(case["requests"]) <= 2
    assert main(["repro", str(files[0]), "--split", "prefix"]) == 1
    assert main(["repro", str(files[0]), "--split", "fixed"]) == 0


def test_atheris_engine_runs_and_grows_the_corpus_on_fixed(tmp_path):
    pytest.importorskip("atheris")
    root = Path(__file__).resolve().parent.parent
    proc = mambafuzz("fuzz", "--split", "fixed", "--engine", "atheris", "--runs", "150", "--max-time", "120",
                     "--corpus", str(tmp_path / "corpus"), "--seeds", "--findings", str(tmp_path / "findings"),
                     "--known", str(root / "corpus" / "regressions"), str(root / "corpus" / "upstream"), cwd=tmp_path)
    # 0, or 1 if it happened on a new variant of a vLLM behaviour (then it is filed like any finding)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "summary: " in proc.stdout and "Traceback" not in proc.stdout
    assert any((tmp_path / "corpus").iterdir())


def test_corpus_commands_reject_missing_directories(tmp_path, capsys):
    for argv in (["corpus", "stats", str(tmp_path / "nope")], ["corpus", "prune", str(tmp_path / "nope")],
                 ["corpus", "merge", str(tmp_path / "dest"), str(tmp_path / "nope")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "nope: no such file or directory" in err and len(err.splitlines()) == 1


def test_fuzz_usage_errors(tmp_path, capsys):
    assert main(["fuzz", "--split", "nope", "--max-time", "1"]) == 2
    assert "unknown split" in capsys.readouterr().err
    assert main(["fuzz", "--jobs", "0", "--max-time", "1"]) == 2
    (tmp_path / "file").write_text("x")
    assert main(["fuzz", "--findings", str(tmp_path / "file"), "--max-time", "1"]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_minimize_command_keeps_the_signature(tmp_path, capsys):
    big = first_chunk_scenario()
    big.requests[0].max_tokens = 7
    big.prefixes = [40]
    big.requests[1].prefix_ids = [0]
    path = tmp_path / "big.json"
    path.write_text(big.dumps())
    assert main(["minimize", str(path), "--split", "prefix", "--budget", "60"]) == 1
    out = tmp_path / "big.min.json"
    small = json.loads(out.read_text())
    assert small["finding"]["signature"] == "slot_hash:short/chunk-end"
    assert sum(r["max_tokens"] for r in small["requests"]) < 11
    assert main(["repro", str(out), "--split", "prefix"]) == 1
    assert main(["minimize", str(path), "--split", "fixed"]) == 0


def test_corpus_add_regression_and_stats(tmp_path, capsys):
    path = tmp_path / "case.json"
    path.write_text(first_chunk_scenario().dumps())
    regs = tmp_path / "regs"
    assert main(["corpus", "add-regression", str(path), "--dir", str(regs), "--name", "fc"]) == 0
    written = json.loads((regs / "fc.json").read_text())
    assert written["expected"] == {"fixed": "clean", "prefix": "slot_hash", "realign": "clean"}
    assert main(["corpus", "add-regression", str(path), "--dir", str(regs), "--name", "fc"]) == 2
    import random
    for i in range(3):
        (regs / f"r{i}.json").write_text(random_scenario(random.Random(i)).dumps())
    (regs / "link.json").symlink_to(regs / "fc.json")
    capsys.readouterr()
    assert main(["corpus", "stats", str(regs), "--no-coverage"]) == 0
    out = capsys.readouterr()
    assert "skipped 1" in out.out and "mamba block" in out.out and "link.json" in out.err


def test_default_input_dirs_are_found_from_any_working_directory(tmp_path, monkeypatch, capsys):
    """`--known`/`--seeds` defaults name project directories: from elsewhere they resolve in the
    checkout (else a warning says what is lost); a directory named explicitly must exist."""
    from fuzz import cli_fuzz

    monkeypatch.chdir(tmp_path)
    got = cli_fuzz._input_dirs(cli_fuzz.DEFAULT_KNOWN, cli_fuzz.DEFAULT_KNOWN, "--known", "lost")
    assert got == [cli_fuzz.PROJECT_ROOT / "corpus/regressions", cli_fuzz.PROJECT_ROOT / "corpus/upstream"]
    assert capsys.readouterr().err == ""

    monkeypatch.setattr(cli_fuzz, "PROJECT_ROOT", tmp_path / "elsewhere")
    assert cli_fuzz._input_dirs(cli_fuzz.DEFAULT_SEEDS, cli_fuzz.DEFAULT_SEEDS, "--seeds", "no seeds") == []
    err = capsys.readouterr().err
    assert "warning: --seeds default corpus/seeds not found" in err and "no seeds" in err

    (tmp_path / "mine").mkdir()
    assert cli_fuzz._input_dirs(["mine"], cli_fuzz.DEFAULT_KNOWN, "--known", "lost") == [Path("mine")]
    assert cli_fuzz._input_dirs([], cli_fuzz.DEFAULT_KNOWN, "--known", "lost") == []  # known signatures off
    assert main(["fuzz", "--engine", "random", "--runs", "1", "--known", "typo"]) == 2
    assert "--known typo: no such directory" in capsys.readouterr().err


def test_atheris_jobs_run_as_separate_libfuzzer_processes_and_are_counted(tmp_path):
    """--jobs 2: two libFuzzer processes on one corpus, both counted in the summary (libFuzzer's
    -fork mode restarted Python for every job and its progress lines went uncounted: 0 executions)."""
    pytest.importorskip("atheris")
    proc = mambafuzz("fuzz", "--split", "fixed", "--engine", "atheris", "--jobs", "2", "--runs", "80",
                     "--max-time", "200", "--corpus", str(tmp_path / "corpus"), "--seeds", "--known",
                     "--findings", str(tmp_path / "findings"), cwd=tmp_path, timeout=400)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    execs = int(proc.stdout.split("summary: ")[1].split()[0])
    assert execs > 40, proc.stdout[-2000:]  # more than one process's share of -runs
    assert "-fork" not in proc.stdout


def test_stop_on_first_stops_every_job(tmp_path, monkeypatch):
    """With --stop-on-first, the other jobs stop once one files a finding (before, they ran on to
    --max-time).  Stand-in workers: one reports a finding and exits, one would sleep for minutes
    with SIGINT ignored, as a job started by a shell without job control has it."""
    from fuzz import supervisor

    finder = [sys.executable, "-c", "print('FOUND slot_hash:short reproduced 3/3 -> x.json', flush=True); exit(1)"]
    sleeper = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                                     "print('@@stat pid=1 execs=5 rejected=0 findings=0 dups=0', flush=True); "
                                     "time.sleep(300)"]
    monkeypatch.setattr(supervisor, "_commands", lambda cfg: [sleeper, finder])
    cfg = supervisor.CampaignConfig(
        engine="random", split="prefix", max_time=300, runs=0, jobs=2, seed=1, corpus=tmp_path / "c",
        seed_dirs=[], findings=tmp_path / "f", known_dirs=[], stop_on_first=True, minimize_budget=1,
        rss_limit_mb=0, quiet=True)
    result = supervisor.run_campaign(cfg, out=open(os.devnull, "w"))
    assert sorted(result.exit_codes) != [0, 0] and result.first_finding_seconds is not None
    assert result.seconds < 120, result  # the sleeper was stopped, not waited for
