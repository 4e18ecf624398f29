"""Determinism, crash-safe writes under SIGKILL, bounded runs, hostile input."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mambafuzz.model.generate import random_scenario
from mambafuzz.model.inputs import decode_input, iter_input_files
from mambafuzz.model.scenario import validate
from mambafuzz.search.worker_protocol import parse_event
from mambafuzz.sim.engine import harness
from mambafuzz.store.corpus import CaseError, WalkStats, atomic_write, iter_cases, parse_case
from mambafuzz.store.report import trace_digest
from tests.conftest import first_chunk_scenario, shared_prefix_scenario

ROOT = Path(__file__).resolve().parents[2]


# ---- determinism -------------------------------------------------------------------------

def _digest_in_subprocess(path: Path, hashseed: str) -> str:
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    proc = subprocess.run([sys.executable, "-m", "mambafuzz.cli.main", "repro", str(path), "--split", "prefix", "--digest",
                           "--json"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    return json.loads(proc.stdout)["digest"]


def test_same_trace_in_separate_processes_under_different_hash_seeds(tmp_path):
    s = first_chunk_scenario()
    s.prefixes = [700]
    s.requests[0].prefix_ids = [0]
    s.requests[1].prefix_ids = [0]
    path = tmp_path / "case.json"
    path.write_text(s.dumps())
    digests = {_digest_in_subprocess(path, seed) for seed in ("0", "1", "12345")}
    assert len(digests) == 1
    assert digests == {trace_digest(harness.run(s, __import__("mambafuzz.sim.engine.splits").sim.engine.splits.prefix_split, "prefix"))}


def test_repeated_runs_in_one_process_are_identical_after_other_work():
    rng = random.Random(7)
    cases = [s for s in (random_scenario(rng) for _ in range(30)) if not validate(s)][:8]
    first = [trace_digest(harness.run(s)) for s in cases]
    harness.run(shared_prefix_scenario())  # unrelated work in between
    again = [trace_digest(harness.run(s)) for s in reversed(cases)][::-1]
    assert first == again


# ---- crash-safe writes -------------------------------------------------------------------

def _fork_worker(target, *args) -> tuple[int, int]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: run, report on the pipe, never return into pytest
        os.close(r)
        os.dup2(w, 1)
        try:
            target(*args)
        finally:
            os._exit(0)
    os.close(w)
    return pid, r


def _fuzz_child(findings: str, seed: int) -> None:
    from mambafuzz.search.target_runtime import Runtime
    from mambafuzz.search.worker_protocol import WorkerConfig

    rt = Runtime(WorkerConfig(split="prefix", findings=findings, generator="random", minimize_budget=5.0))
    rng = random.Random(seed)
    while True:
        s = random_scenario(random.Random(rng.getrandbits(32)))
        if not validate(s):
            rt.run_scenario(s, {"input": "random"})


def _minimize_child(src: str, out: str) -> None:
    from mambafuzz.cli.main import main

    main(["minimize", src, "--split", "prefix", "-o", out, "--budget", "5"])


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            b = os.read(fd, 65536)
        except OSError:
            break
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _check_dir(d: Path) -> int:
    """Every visible file is whole; a SIGKILL can strand a temporary file, but only as a hidden
    `.name.*.tmp`, which every reader skips and the next FindingStore sweeps."""
    checked = 0
    for p in d.rglob("*"):
        if p.is_file():
            if p.name.endswith(".tmp"):
                assert p.name.startswith("."), f"visible temporary file: {p}"
                continue
            if p.suffix == ".json":
                json.loads(p.read_text())  # whole and parsable
            checked += 1
    return checked


@pytest.mark.slow
def test_sigkill_at_random_moments_never_leaves_a_partial_file(tmp_path):
    harness.run(first_chunk_scenario())  # warm the config cache before forking
    rng = random.Random(2024)
    kills = announced = 0
    big = first_chunk_scenario()
    big.prefixes = [64]
    big.requests[1].prefix_ids = [0]
    src = tmp_path / "big.json"
    src.write_text(big.dumps())
    for i in range(24):
        findings = tmp_path / f"findings{i % 6}"
        if i % 4 == 3:
            pid, fd = _fork_worker(_minimize_child, str(src), str(tmp_path / "min" / f"out{i % 2}.json"))
        else:
            pid, fd = _fork_worker(_fuzz_child, str(findings), i)
        time.sleep(rng.uniform(0.05, 2.5))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        kills += 1
        out = _read_all(fd)
        for line in out.splitlines():
            event = parse_event(line)
            if event and event["event"] == "finding":
                path = Path(event["path"])
                assert path.exists(), f"announced but missing: {path}"
                assert json.loads(path.read_text())["finding"]["signature"]
                announced += 1
    checked = sum(_check_dir(d) for d in tmp_path.iterdir() if d.is_dir())
    assert kills >= 20 and checked > 0
    print(f"kills survived: {kills}, findings announced and verified: {announced}, files checked: {checked}")


def test_atomic_write_replaces_whole_files(tmp_path):
    p = tmp_path / "x.json"
    atomic_write(p, "{}")
    atomic_write(p, '{"a": 1}')
    assert json.loads(p.read_text()) == {"a": 1} and [q.name for q in tmp_path.iterdir()] == ["x.json"]


def _sigint_default() -> None:
    # A shell without job control starts background jobs with SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler: give the child the terminal's default, as Ctrl-C
    # at a prompt would find it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_ends_a_fuzz_run_with_its_summary(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "mambafuzz.cli.main", "fuzz", "--split", "prefix", "--generator", "random",
                             "--max-time", "300", "--corpus", str(tmp_path / "c"), "--seeds", "--known",
                             "--findings", str(tmp_path / "f")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_sigint_default)
    deadline = time.monotonic() + 120
    seen = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen += line
        if "execs" in line and "execs 0 " not in line:
            break
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode in (0, 1), seen + rest  # 1: it found something before the interrupt
    assert "interrupted" in rest and "summary:" in rest and "Traceback" not in rest


# ---- bounded runs ----------------------------------------------------------------------------

def test_wall_clock_bound_is_a_stall_finding_not_a_hang():
    from mambafuzz.checks.oracle import judge

    t = harness.run(first_chunk_scenario(), timeout=1e-6)
    f = judge(t).primary
    assert t.timed_out and f.kind == "stall" and f.location == "wall-clock"


def test_step_bound_is_a_stall_finding(monkeypatch):
    from mambafuzz.checks.oracle import judge
    from mambafuzz.model.scenario import Scenario

    s = shared_prefix_scenario()
    assert judge(harness.run(s)).clean
    monkeypatch.setattr(Scenario, "liveness_bound", lambda self: 3)
    trace = harness.run(s)
    assert trace.hit_bound and len(trace.steps) == 3
    assert judge(trace).primary.signature == "stall:step-bound"


# ---- hostile input -----------------------------------------------------------------------

def _mutations():
    base = first_chunk_scenario().dumps()
    return st.one_of(
        st.text(max_size=300),
        st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
        st.tuples(st.integers(0, len(base)), st.integers(0, 40), st.text(max_size=20)).map(
            lambda t: base[: t[0]] + t[2] + base[t[0] + t[1]:]),
        st.integers(1, 5000).map(lambda n: "[" * n + "]" * n),
        st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=20).map(json.dumps),
    )


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(_mutations())
def test_loader_never_raises_anything_but_a_one_line_case_error(text):
    try:
        case = parse_case(text, "fuzzed.json")
    except CaseError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzzed.json: ")
    else:
        assert not validate(case.scenario)


def test_junk_in_a_corpus_directory_is_skipped_with_one_warning_each(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "good.json").write_text(first_chunk_scenario().dumps())
    (d / "junk.json").write_text("{{{{")
    (d / "binary.json").write_bytes(b"\xff\xfe\x00junk")
    (d / "notes.txt").write_text("hello")
    (d / "dir.json").mkdir()
    (d / "link.json").symlink_to(d / "good.json")
    (d / "dangling.json").symlink_to(d / "missing.json")
    os.mkfifo(d / "fifo.json")
    warnings: list[str] = []
    stats = WalkStats()
    cases = list(iter_cases([d], stats, warn=warnings.append))
    assert [c.path.name for c in cases] == ["good.json"]
    assert stats.skipped == 6 and len(warnings) == 6
    assert all("\n" not in w for w in warnings)
    input_stats: dict = {}
    inputs = list(iter_input_files([d], input_stats, warn=warnings.append))
    assert {p.name for p, _ in inputs} == {"good.json", "junk.json", "binary.json", "notes.txt"}
    assert input_stats["skipped"] == 3  # two symlinks and the fifo
    assert decode_input((d / "notes.txt").read_bytes()) is not None  # any bytes decode into the input model
    assert decode_input((d / "good.json").read_bytes()) == cases[0].scenario  # JSON is taken as written


@pytest.mark.slow
def test_two_fuzz_processes_can_share_one_corpus(tmp_path):
    pytest.importorskip("atheris")
    corpus, findings = tmp_path / "corpus", tmp_path / "findings"
    procs = [subprocess.Popen([sys.executable, "-m", "mambafuzz.cli.main", "fuzz", "--split", "prefix", "--generator", "atheris",
                               "--seed", str(seed), "--max-time", "20", "--corpus", str(corpus), "--seeds",
                               "--known", "--findings", str(findings), "--quiet", "--minimize-budget", "3"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for seed in (1, 2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode in (0, 1) for p in procs), outs
    entries = [p for p in corpus.iterdir()]
    assert entries and not [p for p in entries if p.name.endswith(".tmp")]
    for p in entries:
        assert decode_input(p.read_bytes()) is not None or p.read_bytes().lstrip().startswith(b"{")
    assert _check_dir(findings) > 0


def test_flaky_finding_is_filed_as_flaky(tmp_path):
    from mambafuzz.findings import Violation
    from mambafuzz.search.triage import Triage
    from mambafuzz.store.finding_store import FindingStore

    triage = Triage(FindingStore(tmp_path), "tests.helpers.flaky_split:split", repro_runs=6, announce=False)
    filed = triage.handle(first_chunk_scenario(), Violation("slot_hash:short/chunk-end", "seen once"), {"engine": "test"})
    assert filed is not None and filed.flaky and filed.path.name.startswith("flaky-")
    hits, runs = map(int, filed.repro_rate.split("/"))
    assert runs == 6 and 0 < hits < 6
    meta = json.loads(filed.path.read_text())["finding"]
    assert meta["flaky"] is True and meta["reproduced"] == filed.repro_rate
    print(f"constructed flaky case reproduced {filed.repro_rate}")


def test_stale_temporary_files_are_swept(tmp_path):
    from mambafuzz.store.finding_store import FindingStore

    (tmp_path / "raw").mkdir()
    old = tmp_path / "raw" / ".x.json.abc.tmp"
    fresh = tmp_path / ".y.json.def.tmp"
    old.write_text("{")
    fresh.write_text("{")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    FindingStore(tmp_path)
    assert not old.exists() and fresh.exists()  # a fresh one may belong to a live writer


def test_atomic_write_honours_the_umask(tmp_path):
    """Findings and corpus files used to be 0600 whatever the umask (mkstemp's mode)."""
    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "a.json", "{}")
        os.umask(0o077)
        atomic_write(tmp_path / "b.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.json").stat().st_mode & 0o777 == 0o600
