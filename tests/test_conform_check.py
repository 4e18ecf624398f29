"""The mirror against vLLM's own worker code (fuzz/conform_check.py): agreement on the cases
that depend on the runner rules, and a broken mirror rule is caught."""

from pathlib import Path

import pytest

from fuzz import conform_check
from fuzz.corpus import load_case
from fuzz.kernel_model import KernelModel

UPSTREAM = Path(__file__).resolve().parent.parent / "corpus" / "upstream"
V1_SKIP = UPSTREAM / "v1_unscheduled_step_forgets_accepted_tokens" / "v1_unscheduled_step_forgets_accepted_tokens.json"
PADDED = UPSTREAM / "spec_pad_one_token_prompt_unzeroed_block" / "spec_pad_one_token_prompt_unzeroed_block.json"


@pytest.mark.parametrize("path", [V1_SKIP, PADDED], ids=lambda p: p.stem)
def test_the_mirror_agrees_with_vllms_worker_code_on_the_runner_cases(path):
    assert list(conform_check.compare(load_case(path).scenario)) == []


def test_a_mirror_without_v1s_accepted_count_reset_is_caught(monkeypatch):
    monkeypatch.setattr(KernelModel, "begin_step", lambda self, scheduled: [])
    found = list(conform_check.compare(load_case(V1_SKIP).scenario))
    assert found and {d.runner for d in found} == {"v1"}, [d.describe() for d in found]


def test_a_mirror_that_calls_every_padded_row_a_spec_row_is_caught(monkeypatch):
    monkeypatch.setattr(KernelModel, "is_spec_row", lambda self, *args, **kwargs: True)
    found = list(conform_check.compare(load_case(PADDED).scenario))
    assert any(d.runner == "v2" and d.row.num_computed == 0 for d in found), [d.describe() for d in found]


def test_the_conform_command_exit_codes(monkeypatch, capsys):
    from fuzz.cli import main

    assert main(["conform", str(V1_SKIP)]) == 0
    assert "0 disagreeing row(s)" in capsys.readouterr().out
    monkeypatch.setattr(KernelModel, "begin_step", lambda self, scheduled: [])
    assert main(["conform", str(V1_SKIP), "--runner", "v1"]) == 1
    assert "DISAGREE" in capsys.readouterr().out
    assert main(["conform"]) == 2
    from fuzz import vllm_bridge as vb

    def rejected(*args, **kwargs):
        raise vb.ConfigRejected("simulated: every generated config refused")

    monkeypatch.setattr(conform_check, "compare", rejected)
    assert main(["conform", "--random", "0.5"]) == 3  # ran, but checked nothing: never a pass
    assert "checked no scenario" in capsys.readouterr().err


def test_a_copy_into_a_block_a_preempted_request_used_to_hold_is_the_rows_own():
    """The conformance driver once credited r0's pre-copy to r4, preempted in the same step,
    whose stale table still listed the block (corpus/conformance note)."""
    case = UPSTREAM.parent / "conformance" / "v1_precopy_beside_a_same_step_preemption.json"
    assert list(conform_check.compare(load_case(case).scenario, ("v1",))) == []
