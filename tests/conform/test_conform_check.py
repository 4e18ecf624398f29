"""The mirror against vLLM's own worker code (mambafuzz/conform/compare.py): agreement on the cases
that depend on the runner rules, and a broken mirror rule is caught."""

from pathlib import Path

import pytest

from mambafuzz.conform import compare as conform_check
from mambafuzz.model import runners as model_runners
from mambafuzz.sim.worker.kernel_model import KernelModel
from mambafuzz.store.corpus import load_case

UPSTREAM = Path(__file__).resolve().parents[2] / "corpus" / "upstream"
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
    from mambafuzz.cli.main import main

    assert main(["conform", str(V1_SKIP)]) == 0
    assert "0 disagreeing row(s)" in capsys.readouterr().out
    monkeypatch.setattr(KernelModel, "begin_step", lambda self, scheduled: [])
    assert main(["conform", str(V1_SKIP), "--runner", "v1"]) == 1
    assert "DISAGREE" in capsys.readouterr().out
    assert main(["conform"]) == 2
    from mambafuzz.sim.bridge import configs

    def rejected(*args, **kwargs):
        raise configs.ConfigRejected("simulated: every generated config refused")

    monkeypatch.setattr(conform_check, "compare", rejected)
    assert main(["conform", "--random", "0.5"]) == 3  # ran, but checked nothing: never a pass
    assert "checked no scenario" in capsys.readouterr().err


def test_a_copy_into_a_block_a_preempted_request_used_to_hold_is_the_rows_own():
    """The conformance driver once credited r0's pre-copy to r4, preempted in the same step,
    whose stale table still listed the block (corpus/conformance note)."""
    case = UPSTREAM.parent / "conformance" / "v1_precopy_beside_a_same_step_preemption.json"
    assert list(conform_check.compare(load_case(case).scenario, ("v1",))) == []


def test_a_copy_into_a_block_freed_behind_another_row_is_the_owners():
    """r0's told table still lists block 10 in a column vLLM's manager freed behind it; the manager
    gave the block to r1, whose pre-copy into it the driver once credited to r0 (corpus/conformance note)."""
    case = UPSTREAM.parent / "conformance" / "v1_precopy_into_a_block_freed_behind_another_row.json"
    assert list(conform_check.compare(load_case(case).scenario)) == []


def test_a_preemption_in_a_step_without_rows_is_forgotten_by_the_kernel_model_too():
    """Under two pipeline stages r1 is preempted in a step that schedules no rows and re-admitted
    from 0; vLLM's V2 worker forgets it there, so the compared kernel model must see that step
    (it once kept r1's old running column and pre-copied: corpus/conformance note)."""
    case = UPSTREAM.parent / "conformance" / "v2_preemption_in_a_step_without_rows.json"
    assert list(conform_check.compare(load_case(case).scenario, ("v2",))) == []


# ---- row kinds on hand-built steps (what the builder-only check, fuzz/conform.py, held) ------------------
# One request per history, one row per step: (computed, scheduled, drafts, prompt tokens, sampled). The
# last row is the kind named; the rows before it give it its history (an accepted count of 2).
MAMBA_BLOCK_SIZE = 16
TABLE = (5, 6, 7, 8)
AFTER_TWO_ACCEPTED = [(0, 8, 0, 8, 1), (8, 2, 1, 8, 2)]
ROW_KINDS = {
    "one-token prompt padded with a placeholder draft": [(0, 2, 1, 1, 1)],
    "padded prompt tail over computed tokens": [(7, 2, 1, 8, 1)],
    "decode with a draft after 2 accepted tokens": AFTER_TWO_ACCEPTED + [(10, 2, 1, 8, 1)],
    "decode with no draft after 2 accepted tokens": AFTER_TWO_ACCEPTED + [(10, 1, 0, 8, 1)],
    "last prompt token, unpadded": [(7, 1, 0, 8, 1)],
    "first prefill chunk": [(0, 8, 0, 20, 1)],
    "later prefill chunk": [(0, 8, 0, 20, 1), (8, 8, 0, 20, 1)],
    "resumed past its prompt, 2 tokens": [(10, 2, 0, 8, 1)],
    "resumed past its prompt, last token": [(11, 1, 0, 8, 1)],
}


def row_kind_disagreements(runner: str, k: int, history) -> list:
    """Feed `history` to vLLM's own worker for `runner` (an MTP engine with k drafts, or none) and
    hold the kernel model against what it did."""
    from mambafuzz.conform.drive import ConformStep
    from mambafuzz.conform.rows import RowInput, StepInput
    from mambafuzz.conform.v1 import V1Worker
    from mambafuzz.conform.v2 import V2Worker
    from mambafuzz.model.scenario import EngineConfig
    from mambafuzz.sim.bridge import configs

    spec = dict(spec_method="mtp", num_speculative_tokens=k) if k else {}
    e = EngineConfig(mamba_block_size=MAMBA_BLOCK_SIZE, attn_block_size=MAMBA_BLOCK_SIZE,
                     max_num_batched_tokens=512, **spec)
    group_spec = configs.kv_cache_config_for(e, 64, 4096).kv_cache_groups[1].kv_cache_spec
    worker = (V1Worker if runner == "v1" else V2Worker)(configs.vllm_config_for(e, 1024), group_spec, 64,
                                                         MAMBA_BLOCK_SIZE, MAMBA_BLOCK_SIZE, 1024)
    steps = []
    for step, (computed, scheduled, drafts, prompt, sampled) in enumerate(history):
        si = StepInput((RowInput("a", computed, scheduled, drafts, prompt, TABLE, sampled),))
        steps.append(ConformStep(step, si, tuple(worker.step(si))))
    g = conform_check.geometry(e, MAMBA_BLOCK_SIZE, MAMBA_BLOCK_SIZE)
    return list(conform_check.compare_steps(e, g, steps, (runner,)))


@pytest.mark.parametrize("k", [1, 0], ids=["mtp-k1", "no-spec"])
@pytest.mark.parametrize("runner", model_runners.names())
@pytest.mark.parametrize("kind", ROW_KINDS)
def test_the_mirror_agrees_with_vllms_worker_on_each_row_kind(kind, runner, k):
    history = ROW_KINDS[kind]
    if not k and any(drafts for _, _, drafts, _, _ in history):
        pytest.skip("drafts need a spec-decode engine")
    found = row_kind_disagreements(runner, k, history)
    assert found == [], [d.describe() for d in found]


def test_a_mixer_rule_broken_on_a_row_kind_is_caught(monkeypatch):
    """GDN's builder takes every row with drafts down the spec path (gdn_attn.py:292); a mirror
    that sends it down the prefill path reads and writes the wrong columns."""
    from mambafuzz.sim.worker import mixers

    monkeypatch.setattr(mixers.GDN, "path", staticmethod(lambda *args, **kwargs: mixers.PREFILL))
    found = row_kind_disagreements("v1", 1, ROW_KINDS["decode with a draft after 2 accepted tokens"])
    assert any(d.mixer == "gdn" for d in found), found


def test_worker_code_of_another_release_is_a_one_line_unsupported_vllm(monkeypatch):
    """Outside 0.32/0.33 a missing worker API is an unsupported vLLM (ToolError, one line);
    on those releases it stays an internal error, because there it is mambafuzz's bug."""
    import pytest

    from mambafuzz.cli import conformance
    from mambafuzz.exit_codes import ToolError
    from mambafuzz.sim.bridge.vllm_compat import about

    def missing_api():
        with conformance.worker_code_of_other_releases_is_unsupported():
            raise AttributeError("'Mamba2AttentionMetadata' object has no attribute 'checkpoint_meta'")

    monkeypatch.setattr(about, "vllm_version", lambda: "0.31.0")
    with pytest.raises(ToolError, match=r"vLLM 0\.31\.0's differs .*checkpoint_meta"):
        missing_api()
    monkeypatch.setattr(about, "vllm_version", lambda: "0.32.0")
    with pytest.raises(AttributeError):
        missing_api()



def test_each_runner_is_held_against_a_scheduler_built_for_it(monkeypatch, capsys, tmp_path):
    """vLLM's scheduler hands V1 and V2 different outputs, so a runner's worker code is driven by
    a scheduler with that runner's flag, and a runner the config cannot run on is left out (a
    V1 worker fed a 4-stage V2 scheduler's outputs once reported rows no V1 engine runs)."""
    import dataclasses

    from mambafuzz.cli.main import main
    from mambafuzz.conform import drive as conform_drive

    s = load_case(V1_SKIP).scenario
    s = dataclasses.replace(s, engine=dataclasses.replace(s.engine, runner=None))
    driven = []
    real_drive = conform_drive.drive

    def recording(scenario, runners=None):
        driven.append((scenario.engine.runner, runners))
        return real_drive(scenario, runners)

    monkeypatch.setattr(conform_drive, "drive", recording)
    list(conform_check.compare(s, ("v1", "v2")))
    assert driven == [("v1", ("v1",)), ("v2", ("v2",))]

    staged = dataclasses.replace(s, engine=dataclasses.replace(s.engine, pipeline_parallel_size=2, async_scheduling=True))
    assert [(r, own is None) for r, own in conform_check.per_runner(staged, ("v1", "v2"))] == [("v1", True), ("v2", False)]
    driven.clear()
    assert list(conform_check.compare(staged, ("v1",))) == [] and driven == []
    path = tmp_path / "staged.json"
    path.write_text(staged.dumps())
    assert main(["conform", str(path), "--runner", "v1"]) == 3  # nothing checked: never a pass
    assert "1 not run on v1" in capsys.readouterr().out


@pytest.mark.parametrize("name,field", [("v2_mamba2_padded_fresh_prompt_demotes_a_zero_draft_decode.json", "read"),
                                        ("v2_mamba2_padded_fresh_prompt_demotes_a_cut_draft_decode.json", "writes")])
def test_a_padded_fresh_prompt_sorted_first_demotes_v2_mamba2_decodes_until_finding_2s_fix(name, field):
    """Upstream finding 2's trigger seen from another row (corpus/conformance note): on V2 the
    padded fresh prompt sorts ahead of a cut-draft decode, which Mamba2's builder then runs as a
    prefill; with finding 2's candidate fix the scenario agrees."""
    from mambafuzz.conform import target as conform_target
    from mambafuzz.sim import patching

    s = load_case(UPSTREAM.parent / "conformance" / name).scenario
    assert conform_target.verdict(s, ("v1",)) is None
    assert conform_target.verdict(s, ("v2",)).signature == f"conform:{field}/mamba2@v2"
    fix = UPSTREAM / "spec_pad_one_token_prompt_unzeroed_block" / "fix.py"
    with patching.applied(patching.load_patches(str(fix))):
        assert conform_target.verdict(s, ("v2",)) is None


def _gather_by_request(worker, num_reqs: int) -> None:
    """The previous step's accepted counts as a snapshot keyed by request (a request still mapped
    keeps its count, every other row 1): the fix vllm-project/vllm#51571's reports propose."""
    ib = worker.input_batch
    prev = ib.prev_req_id_to_index or {}
    snapshot = {rid: worker._landing.get(i, int(ib.num_accepted_tokens_cpu[i])) for rid, i in prev.items()}
    worker._landing = {}
    ib.num_accepted_tokens_cpu[:num_reqs] = [snapshot.get(rid, 1) for rid in ib.req_ids[:num_reqs]]


def test_v1_async_reads_an_accepted_count_from_a_row_condense_moved(monkeypatch):
    """vllm-project/vllm#51571's family (corpus/conformance note): with every sampled row of the
    previous step gone, V1's empty prev_req_id_to_index takes the synchronous branch and a moved
    row reads the count another request's copy landed there; keyed by request, it agrees."""
    from mambafuzz.conform import target as conform_target
    from mambafuzz.conform import v1

    s = load_case(UPSTREAM.parent / "conformance" / "v1_async_accepted_count_read_from_a_moved_row.json").scenario
    assert conform_target.verdict(s, ("v1",)).signature == "conform:read/mamba2@v1"
    assert conform_target.verdict(s, ("v2",)) is None
    monkeypatch.setattr(v1.V1Worker, "gather_async_accepted", _gather_by_request)
    assert conform_target.verdict(s, ("v1",)) is None


def test_a_scheduler_crash_is_not_judged_by_the_conformance_tier(capsys):
    """vLLM's scheduler raising (upstream finding 4's admission estimate, once the drive loads the
    connector's tokens) is the scheduler target's finding: the tier says so and judges nothing."""
    from mambafuzz.cli.main import main
    from mambafuzz.conform import target as conform_target
    from mambafuzz.model.scenario import ScenarioError

    path = UPSTREAM / "connector_admission_estimate_short_per_mamba_group" / "connector_admission_two_requests.json"
    with pytest.raises(ScenarioError, match="scheduler raised ValueError"):
        conform_target.verdict(load_case(path).scenario, ("v1",))
    assert main(["conform", str(path), "--runner", "v1"]) == 3  # nothing judged: never a pass
    out = capsys.readouterr().out
    assert "NOT JUDGED" in out and "1 not judged" in out
