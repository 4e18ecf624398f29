"""`mambafuzz fuzz`, `minimize` and `corpus` end to end (short, bounded runs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mambafuzz.cli.main import main
from mambafuzz.model.generate import random_scenario
from tests.conftest import first_chunk_scenario


def mambafuzz(*args, cwd, timeout=240):
    return subprocess.run([sys.executable, "-m", "mambafuzz.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_random_engine_finds_the_prefix_bug_from_an_empty_corpus_and_files_it_minimized(tmp_path):
    proc = mambafuzz("fuzz", "--split", "prefix", "--generator", "random", "--max-time", "60", "--stop-on-first",
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
    root = Path(__file__).resolve().parents[2]
    proc = mambafuzz("fuzz", "--split", "fixed", "--generator", "atheris", "--runs", "150", "--max-time", "120",
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
    assert main(["fuzz", "--base", str(tmp_path), "--max-time", "1"]) == 2
    err = capsys.readouterr().err
    assert "--base" in err and "pr-overlay" in err and len(err.strip().splitlines()) == 1


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
    from mambafuzz.cli import fuzzing as cli_fuzz

    monkeypatch.chdir(tmp_path)
    got = cli_fuzz.input_dirs(cli_fuzz.DEFAULT_KNOWN, cli_fuzz.DEFAULT_KNOWN, "--known", "lost")
    assert got == [cli_fuzz.PROJECT_ROOT / "corpus/regressions", cli_fuzz.PROJECT_ROOT / "corpus/upstream"]
    assert capsys.readouterr().err == ""

    monkeypatch.setattr(cli_fuzz, "PROJECT_ROOT", tmp_path / "elsewhere")
    assert cli_fuzz.input_dirs(cli_fuzz.DEFAULT_SEEDS, cli_fuzz.DEFAULT_SEEDS, "--seeds", "no seeds") == []
    err = capsys.readouterr().err
    assert "warning: --seeds default corpus/seeds not found" in err and "no seeds" in err

    (tmp_path / "mine").mkdir()
    assert cli_fuzz.input_dirs(["mine"], cli_fuzz.DEFAULT_KNOWN, "--known", "lost") == [Path("mine")]
    assert cli_fuzz.input_dirs([], cli_fuzz.DEFAULT_KNOWN, "--known", "lost") == []  # known signatures off
    assert main(["fuzz", "--generator", "random", "--runs", "1", "--known", "typo"]) == 2
    assert "--known typo: no such directory" in capsys.readouterr().err


def test_atheris_jobs_run_as_separate_libfuzzer_processes_and_are_counted(tmp_path):
    """--jobs 2: two libFuzzer processes on one corpus, both counted in the summary (libFuzzer's
    -fork mode restarted Python for every job and its progress lines went uncounted: 0 executions)."""
    pytest.importorskip("atheris")
    proc = mambafuzz("fuzz", "--split", "fixed", "--generator", "atheris", "--jobs", "2", "--runs", "80",
                     "--max-time", "200", "--corpus", str(tmp_path / "corpus"), "--seeds", "--known",
                     "--findings", str(tmp_path / "findings"), cwd=tmp_path, timeout=400)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    execs = int(proc.stdout.split("summary: ")[1].split()[0])
    assert execs > 40, proc.stdout[-2000:]  # more than one process's share of -runs
    assert "-fork" not in proc.stdout


def _stand_in(*lines: str, then: str = "") -> list[str]:
    """A stand-in worker that prints `lines` (worker events) and then runs `then`."""
    code = "".join(f"print({line!r}, flush=True); " for line in lines) + then
    return [sys.executable, "-c", code]


def _config(tmp_path, **kw):
    from mambafuzz.search import supervisor

    base = dict(generator="random", split="prefix", max_time=300, runs=0, jobs=2, seed=1, corpus=tmp_path / "c",
                seed_dirs=[], findings=tmp_path / "f", known_dirs=[], stop_on_first=True, minimize_budget=1,
                rss_limit_mb=0, quiet=True)
    base.update(kw)
    return supervisor.CampaignConfig(**base)


def test_stop_on_first_stops_every_job(tmp_path, monkeypatch):
    """With --stop-on-first, the other jobs stop once one files a finding (before, they ran on to
    --max-time).  Stand-in workers: one reports a finding and exits, one would sleep for minutes
    with SIGINT ignored, as a job started by a shell without job control has it."""
    from mambafuzz.search import supervisor
    from mambafuzz.search.worker_protocol import WorkerConfig

    started = '@@event {"event":"started","pid":1}'
    finder = _stand_in(started, '@@event {"event":"progress","pid":1,"execs":3}',
                       '@@event {"event":"finding","pid":1,"signature":"slot_hash:short","path":"x.json",'
                       '"flaky":false,"reproduced":"3/3"}', then="exit(1)")
    sleeper = _stand_in(started, '@@event {"event":"progress","pid":2,"execs":5}',
                        then="import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(300)")
    monkeypatch.setattr(supervisor, "launches", lambda cfg, workdir: [supervisor.Launch(sleeper, WorkerConfig()),
                                                                      supervisor.Launch(finder, WorkerConfig())])
    result = supervisor.run_campaign(_config(tmp_path), out=open(os.devnull, "w"))
    assert result.first_finding_seconds is not None and result.new_files == [Path("x.json")]
    assert result.seconds < 120, result  # the sleeper was stopped, not waited for
    assert result.problems == [] and result.execs == 8  # stopped by us: not a dead worker


def test_a_campaign_that_ran_nothing_or_lost_a_worker_is_a_problem(tmp_path, monkeypatch):
    """Workers that never start, say they cannot run, or die are each named; no execution at all
    is named too.  (Before, such a campaign printed "0 executions" and passed.)"""
    from mambafuzz.search import supervisor
    from mambafuzz.search.worker_protocol import WorkerConfig

    cases = {
        "silent": (_stand_in("no vllm here", then="exit(0)"), ["exited 0 before it started: no vllm here",
                                                                 "executed no input"]),
        "error": (_stand_in('@@event {"event":"error","pid":1,"message":"ImportError: no vllm"}', then="exit(3)"),
                  ["cannot run: ImportError: no vllm"]),
        "dies": (_stand_in('@@event {"event":"started","pid":1}', '@@event {"event":"progress","pid":1,"execs":4}',
                           "Traceback: boom", then="exit(77)"), ["died (exit 77): Traceback: boom"]),
    }
    for name, (argv, expected) in cases.items():
        monkeypatch.setattr(supervisor, "launches", lambda cfg, workdir, argv=argv: [supervisor.Launch(argv,
                                                                                                       WorkerConfig())])
        result = supervisor.run_campaign(_config(tmp_path, jobs=1, stop_on_first=False), out=open(os.devnull, "w"))
        for text in expected:
            assert any(text in p for p in result.problems), (name, result.problems)
    healthy = _stand_in('@@event {"event":"started","pid":1}', '@@event {"event":"done","pid":1,"execs":2}')
    monkeypatch.setattr(supervisor, "launches", lambda cfg, workdir: [supervisor.Launch(healthy, WorkerConfig())])
    assert supervisor.run_campaign(_config(tmp_path, jobs=1), out=open(os.devnull, "w")).problems == []


def test_tool_failures_on_single_inputs_are_counted_and_the_campaign_goes_on(tmp_path, monkeypatch, capsys):
    """A worker that failed on some inputs and went on: the campaign counts them, names where the
    inputs are kept, and `mambafuzz fuzz` still exits 3 (a tool failure, not a clean result)."""
    from mambafuzz.search import supervisor
    from mambafuzz.search.worker_protocol import WorkerConfig

    worker = _stand_in('@@event {"event":"started","pid":1}',
                       '@@event {"event":"tool_error","pid":1,"message":"IndexError: x (input kept: k.json)"}',
                       '@@event {"event":"tool_error","pid":1,"message":"IndexError: y (input kept: l.json)"}',
                       '@@event {"event":"done","pid":1,"execs":5,"tool_errors":2}')
    monkeypatch.setattr(supervisor, "launches", lambda cfg, workdir: [supervisor.Launch(worker, WorkerConfig())])
    result = supervisor.run_campaign(_config(tmp_path, jobs=1, stop_on_first=False), out=open(os.devnull, "w"))
    assert result.tool_errors == 2 and result.execs == 5
    assert len(result.problems) == 1 and "2 tool failure(s)" in result.problems[0], result.problems
    monkeypatch.setattr(supervisor, "run_campaign", lambda cfg: result)
    assert main(["fuzz", "--max-time", "1", "--corpus", str(tmp_path / "c"), "--findings", str(tmp_path / "f")]) == 3
    captured = capsys.readouterr()
    assert "2 tool failure(s)" in captured.out and "failed on some inputs" in captured.err


def test_a_pre_existing_finding_is_reported_and_is_not_new(tmp_path, monkeypatch):
    """PR mode: a finding the base shows too is listed apart and does not make the campaign fail."""
    from mambafuzz.search import supervisor
    from mambafuzz.search.worker_protocol import WorkerConfig

    worker = _stand_in('@@event {"event":"started","pid":1}',
                       '@@event {"event":"finding","pid":1,"signature":"stall:x","path":"p.json","pre_existing":true}',
                       '@@event {"event":"done","pid":1,"execs":3}')
    monkeypatch.setattr(supervisor, "launches", lambda cfg, workdir: [supervisor.Launch(worker, WorkerConfig())])
    result = supervisor.run_campaign(_config(tmp_path, jobs=1, stop_on_first=True), out=open(os.devnull, "w"))
    assert result.new_files == [] and result.pre_existing == [Path("p.json")] and result.first_finding_seconds is None
    monkeypatch.setattr(supervisor, "run_campaign", lambda cfg: result)
    assert main(["fuzz", "--max-time", "1", "--corpus", str(tmp_path / "c"), "--findings", str(tmp_path / "f"),
                 "--base", "installed"]) == 0


def _python3_without_vllm(tmp_path) -> Path:
    """A directory whose `python3` is an interpreter that cannot import vLLM."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(candidate).exists() and subprocess.run([candidate, "-c", "import vllm"],
                                                        capture_output=True).returncode != 0:
            (bin_dir / "python3").symlink_to(candidate)
            return bin_dir
    script = bin_dir / "python3"
    script.write_text("#!/bin/sh\necho 'this python3 has no vLLM' >&2\nexit 1\n")
    script.chmod(0o755)
    return bin_dir


def test_workers_run_under_mambafuzz_own_interpreter_whatever_python3_is_first_on_path(tmp_path):
    """The silent-green case: the atheris target used to start through `#!/usr/bin/env python3`,
    so with a vLLM-less python3 first on PATH it fuzzed nothing and the campaign exited 0."""
    pytest.importorskip("atheris")
    env = dict(os.environ, PATH=f"{_python3_without_vllm(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run([sys.executable, "-m", "mambafuzz.cli.main", "fuzz", "--generator", "atheris", "--runs", "30",
                           "--max-time", "200", "--corpus", str(tmp_path / "c"), "--seeds", "--known",
                           "--findings", str(tmp_path / "f")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert int(proc.stdout.split("summary: ")[1].split()[0]) >= 30
    assert f"under {sys.executable}" in proc.stdout


def test_a_worker_that_cannot_import_vllm_fails_the_campaign_in_one_line(tmp_path):
    """Every generator: a worker whose vLLM import fails makes `mambafuzz fuzz` exit 3 (a tool
    failure, never 0 or the 1 of a finding) and say why on one line per problem."""
    fake = tmp_path / "fake"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("raise ImportError('simulated: this vLLM cannot be imported')\n")
    from mambafuzz.search import supervisor

    for generator in ("random", "atheris"):
        if generator == "atheris":
            pytest.importorskip("atheris")
        cfg = _config(tmp_path / generator, generator=generator, jobs=1, runs=5, max_time=60, stop_on_first=False)
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(fake)  # only the workers start after this; vLLM is loaded here already
        try:
            result = supervisor.run_campaign(cfg, out=open(os.devnull, "w"))
        finally:
            if old is None:
                os.environ.pop("PYTHONPATH")
            else:
                os.environ["PYTHONPATH"] = old
        assert any("cannot run:" in p and "simulated: this vLLM cannot be imported" in p
                   for p in result.problems), (generator, result)
        assert "the campaign executed no input" in result.problems


def test_cmd_fuzz_exits_3_with_one_line_per_problem(tmp_path, monkeypatch, capsys):
    from mambafuzz.search import supervisor

    def run_campaign(cfg):
        return supervisor.CampaignResult([], 0, 1.0, None, None, False, [3], None, ["ImportError: x"],
                                         ["worker 7 cannot run: ImportError: x", "the campaign executed no input"])

    monkeypatch.setattr(supervisor, "run_campaign", run_campaign)
    assert main(["fuzz", "--generator", "random", "--max-time", "1", "--corpus", str(tmp_path / "c"),
                 "--findings", str(tmp_path / "f")]) == 3
    err = capsys.readouterr().err
    assert "mambafuzz: worker 7 cannot run: ImportError: x" in err and "Traceback" not in err
    assert "did not really run" in err
