"""`mambafuzz repro` exit codes and messages."""

import json
import subprocess
import sys

import pytest

from mambafuzz.cli.main import main
from tests.conftest import first_chunk_scenario


@pytest.fixture
def first_chunk_file(tmp_path):
    p = tmp_path / "first_chunk.json"
    p.write_text(first_chunk_scenario().dumps())
    return p


def test_repro_exit_codes_per_split(first_chunk_file, capsys):
    assert main(["repro", str(first_chunk_file)]) == 0
    assert "clean" in capsys.readouterr().out
    assert main(["repro", str(first_chunk_file), "--split", "prefix"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATION slot_hash" in out and "slot 0 of r1" in out and "after 1600 tokens" in out
    assert "holds state@768" in out


def test_repro_json_and_trace(first_chunk_file, capsys):
    assert main(["repro", str(first_chunk_file), "--split", "prefix", "--json"]) == 1
    obj = json.loads(capsys.readouterr().out)
    assert obj["verdict"] == "slot_hash" and obj["findings"][0]["signature"] == "slot_hash:short/chunk-end"
    assert main(["repro", str(first_chunk_file), "--split", "prefix", "--trace"]) == 1
    assert "POISONED" in capsys.readouterr().out


def test_a_finding_on_a_scheduler_only_config_says_so(tmp_path, first_chunk_file, capsys):
    """Attention blocks finer than the mamba block exist only at scheduler level: the verdict says
    so; the same finding with engine-real (tied) blocks carries no such note."""
    assert main(["repro", str(first_chunk_file), "--split", "prefix"]) == 1
    assert "note: attn_block_size 16 != mamba_block_size 1600" in capsys.readouterr().out
    tied = first_chunk_scenario()
    tied.engine.attn_block_size = tied.engine.mamba_block_size
    path = tmp_path / "tied.json"
    path.write_text(tied.dumps())
    assert main(["repro", str(path), "--split", "prefix", "--json"]) == 1
    obj = json.loads(capsys.readouterr().out)
    assert obj["verdict"] == "slot_hash" and obj["realism_notes"] == []


@pytest.mark.parametrize("content, needle", [
    ("{", "not valid JSON"),
    ('{"format": "x"}', "format must be"),
    ("[]", "top level must be an object"),
])
def test_bad_files_get_one_line_and_exit_2(tmp_path, capsys, content, needle):
    p = tmp_path / "bad.json"
    p.write_text(content)
    assert main(["repro", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and str(p) in err and len(err.splitlines()) == 1


def test_missing_file_bad_split_and_config_rejected(tmp_path, first_chunk_file, capsys):
    assert main(["repro", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["repro", str(first_chunk_file), "--split", "nosuch"]) == 2
    assert "unknown split" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["repro"])
    assert exit_info.value.code == 2


def test_expected_verdict_is_compared(tmp_path, capsys):
    raw = first_chunk_scenario().to_json()
    raw["expected"] = {"prefix": "clean"}
    p = tmp_path / "case.json"
    p.write_text(json.dumps(raw))
    assert main(["repro", str(p), "--split", "prefix"]) == 1
    assert "expected: clean (MISMATCH)" in capsys.readouterr().out


def test_console_script_runs(first_chunk_file):
    proc = subprocess.run([sys.executable, "-m", "mambafuzz.cli.main", "repro", str(first_chunk_file), "--split", "prefix",
                           "--no-differential"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_repro_raw_reads_a_fuzzing_corpus_input_as_the_targets_decode_it(tmp_path, capsys):
    """Raw libFuzzer inputs (corpus/generated, crash-* files) replay with --raw, through the same
    decoder the fuzz targets use; without --raw the one-line error says to add it."""
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.model.inputs import MAX_INPUT_BYTES, decode_input

    data = bytes(range(7, 250, 3)) * 3
    raw = tmp_path / "crash-0123"
    raw.write_bytes(b"\xff" + data)
    assert main(["repro", str(raw)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not UTF-8 text" in err and "add --raw" in err and len(err.splitlines()) == 1

    code = main(["repro", "--raw", "--json", "--split", "prefix", str(raw)])
    want = evaluate(decode_input(b"\xff" + data), "prefix")
    assert json.loads(capsys.readouterr().out)["verdict"] == want.verdict.kind
    assert code == (0 if want.verdict.clean else 1)

    # --print-scenario prints only the scenario, which saved as a file replays the same way
    assert main(["repro", "--raw", "--print-scenario", str(raw)]) == 0
    text = capsys.readouterr().out
    saved = tmp_path / "saved.json"
    saved.write_text(text)
    assert main(["repro", "--json", "--split", "prefix", str(saved)]) == code
    assert json.loads(capsys.readouterr().out)["verdict"] == want.verdict.kind

    # the hypothesis engine's decoder reads the same bytes as another scenario
    assert main(["repro", "--raw", "--decoder", "hypothesis", "--print-scenario", str(raw)]) == 0
    assert json.loads(capsys.readouterr().out) != json.loads(text)

    big = tmp_path / "big"
    big.write_bytes(b"x" * (MAX_INPUT_BYTES + 1))
    assert main(["repro", "--raw", str(big), str(tmp_path / "gone")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "more than a fuzz target reads" in err[0] and "no such file" in err[1]


def test_a_crash_of_mambafuzz_itself_is_exit_3_in_one_line_never_a_finding(monkeypatch, capsys, first_chunk_file):
    """An uncaught exception used to exit 1, the code for "violation found"."""
    from mambafuzz.checks import pipeline
    from mambafuzz.cli import main as cli

    def broken(*args, **kwargs):
        raise RuntimeError("simulated bug in mambafuzz\nsecond line")

    monkeypatch.setattr(pipeline, "evaluate", broken)
    assert cli.main(["repro", str(first_chunk_file)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "internal error: RuntimeError: simulated bug in mambafuzz" in err
    assert "not a finding" in err


def test_a_scheduling_override_the_scenario_cannot_take_is_one_line(tmp_path, capsys):
    """`--scheduling sync` on a pipeline-parallel scenario (modelled under async only) is a usage
    error in one line, not an internal error."""
    s = first_chunk_scenario()
    s.engine.pipeline_parallel_size = 2
    p = tmp_path / "pp.json"
    p.write_text(s.dumps())
    assert main(["repro", str(p), "--scheduling", "sync"]) == 2
    err = capsys.readouterr().err
    assert "needs async scheduling" in err and "internal error" not in err and len(err.strip().splitlines()) == 1
