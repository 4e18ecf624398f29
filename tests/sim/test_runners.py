"""The runner and mixer rules (mambafuzz/sim/worker/runners.py, mambafuzz/sim/worker/mixers.py), each on the row that tells the
two implementations apart, plus the kernel model's per-runner bookkeeping on tiny tables."""

from types import SimpleNamespace

from mambafuzz.sim.state import EMPTY, PrefixStates
from mambafuzz.sim.worker.kernel_model import ZEROED, KernelGeometry, KernelModel
from mambafuzz.sim.worker.mixers import GDN, PREFILL, SPEC, Mamba2
from mambafuzz.sim.worker.runners import BuilderInputs, RowFacts, V1Runner, V2Runner

TOKENS = list(range(1, 30))
TRUTH = PrefixStates(TOKENS)
K = 1  # speculative tokens

# A one-token prompt padded by the scheduler (pad_spec_decode): 1 real token + K placeholder drafts.
PADDED_PROMPT = RowFacts(num_computed=0, num_scheduled=1 + K, num_drafts=K, num_prompt_tokens=1, prefill_len=1)


def model(runner="v1", mixer="gdn", **kw):
    g = dict(block_size=4, hash_block_size=4, checkpoint_alignment=None, cache_hit_alignment_tokens=4,
             drop_eagle_block=False, null_block_id=0, vocab_size=1024, spec_engine=True, num_speculative_tokens=2)
    g.update(kw)
    return KernelModel(KernelGeometry(**g), runner=runner, mixer=mixer)


# ---- runner row facts ---------------------------------------------------------------------------

def test_v1_counts_a_padded_one_token_prompt_as_a_decode_row():
    """gpu_model_runner.py: num_scheduled == drafts + 1 sets num_decode_draft_tokens = drafts."""
    assert V1Runner.builder_inputs(PADDED_PROMPT, True, K) == BuilderInputs(True, K)


def test_v2_keeps_a_padded_prompt_with_nothing_computed_a_prefill_row():
    """model_runner.py gather_batch_req_state: prefill_runs_as_decode needs computed prefill tokens."""
    assert V2Runner.builder_inputs(PADDED_PROMPT, True, K) == BuilderInputs(True, -1)


def test_v2_runs_a_padded_prompt_tail_over_computed_tokens_as_a_decode():
    tail = RowFacts(num_computed=7, num_scheduled=1 + K, num_drafts=K, num_prompt_tokens=8, prefill_len=8)
    assert V2Runner.builder_inputs(tail, True, K) == BuilderInputs(False, K)
    assert V1Runner.builder_inputs(tail, True, K) == BuilderInputs(True, K)


def test_v1_zero_draft_decode_only_past_the_prompt():
    decode = RowFacts(num_computed=8, num_scheduled=1, num_drafts=0, num_prompt_tokens=8, prefill_len=8)
    last_prompt_token = RowFacts(7, 1, 0, 8, 8)
    assert V1Runner.builder_inputs(decode, True, K).decode_drafts == 0
    assert V1Runner.builder_inputs(last_prompt_token, True, K).decode_drafts == -1
    assert V2Runner.builder_inputs(last_prompt_token, True, K).decode_drafts == 0  # prefill_runs_as_decode


def test_v2_replaying_outputs_after_preemption_is_still_prefilling():
    """prefill_len counts the replayed outputs under V2; V1 compares against the prompt only."""
    replay = RowFacts(num_computed=10, num_scheduled=2, num_drafts=0, num_prompt_tokens=8, prefill_len=12)
    assert V2Runner.builder_inputs(replay, True, K).is_prefilling
    assert not V1Runner.builder_inputs(replay, True, K).is_prefilling


def test_no_decode_rows_outside_a_spec_decode_engine():
    assert V1Runner.builder_inputs(PADDED_PROMPT, False).decode_drafts == -1
    assert V2Runner.builder_inputs(RowFacts(8, 1, 0, 8, 8), False).decode_drafts == -1


# ---- mixer classification -----------------------------------------------------------------------

def test_gdn_spec_rows_are_exactly_the_decode_rows_the_runner_marks():
    assert GDN.path(BuilderInputs(True, K), 0, 1 + K, True, K) == SPEC
    assert GDN.path(BuilderInputs(True, -1), 0, 1 + K, True, K) == PREFILL
    assert GDN.path(BuilderInputs(False, 0), 8, 1, True, K) == SPEC  # a zero-draft decode
    assert GDN.path(BuilderInputs(False, 0), 8, 1, False, 0) == PREFILL  # no spec kernel without spec decode


def test_mamba2_runs_a_padded_prompt_with_nothing_computed_as_a_prefill_on_either_runner():
    """mamba_attn.py: padded prompt tails become decodes only with prior state."""
    for runner in (V1Runner, V2Runner):
        assert Mamba2.path(runner.builder_inputs(PADDED_PROMPT, True, K), 0, 1 + K, True, K) == PREFILL


def test_mamba2_turns_one_token_prefills_with_prior_state_into_decodes():
    inputs = V1Runner.builder_inputs(RowFacts(7, 1, 0, 8, 8), True, K)  # V1: still prefilling, decode_drafts -1
    assert Mamba2.path(inputs, 7, 1, True, K) == SPEC
    assert GDN.path(inputs, 7, 1, True, K) == PREFILL


def test_mamba2_short_non_prefilling_rows_are_decodes_whatever_their_drafts():
    """V1 replaying outputs after preemption: not prefilling, 2 tokens <= 1 + k, no drafts."""
    inputs = V1Runner.builder_inputs(RowFacts(10, 2, 0, 8, 12), True, 2)
    assert Mamba2.path(inputs, 10, 2, True, 2) == SPEC
    assert GDN.path(inputs, 10, 2, True, 2) == PREFILL
    assert Mamba2.path(inputs, 10, 4, True, 2) == PREFILL  # longer than 1 + k


# ---- kernel model bookkeeping -------------------------------------------------------------------

def _accept_two(m):
    """A spec row over 4..7 that keeps 2 tokens without crossing a block: state@6 is left in
    column 2 (curr 1 + accepted 2 - 1)."""
    table = [11, 12, 13, 14]
    m.held[12] = TRUTH.at(4)  # the running state, in column 1 since the last step
    m._prev_column["r"] = 1
    m.run_row("r", table, 4, TOKENS[4:7], 2, spec_row=True)  # both drafts right; 2 kept
    m.postprocess_spec("r", table, 4, 3, 2, 2)
    return table


def test_v1_forgets_the_accepted_count_of_a_request_it_did_not_schedule():
    """V1 re-adds an unscheduled request with num_accepted_tokens_cpu = 1 and keeps its
    mamba_state_idx, so the next row starts from the column of the first token."""
    for runner, skipped, column in (("v1", True, 1), ("v1", False, 2), ("v2", True, 2)):
        m = model(runner)
        table = _accept_two(m)
        if skipped:
            assert m.begin_step({"other": 1}) == (["r"] if runner == "v1" else [])
        assert m.begin_step({"r": 3}) == []
        row = m.run_row("r", table, 6, TOKENS[6:7], 0, spec_row=True)  # a zero-draft decode, same block
        assert row.read_column == column, (runner, skipped)
        assert (row.read_state == TRUTH.at(6)) == (column == 2)


def test_no_prefix_caching_runs_from_the_requests_own_first_block_without_copies():
    m = model(align=False)
    table = [21, 22, 23]  # 1 + k blocks, whatever the sequence length
    m.run_row("r", table, 0, TOKENS[:9], 0)
    assert m.state_of(21) == TRUTH.at(9)
    row = m.run_row("r", table, 9, TOKENS[9:12], 2, spec_row=True)  # both drafts right; 2 kept
    assert row.read_column == 0 and [w[0] for w in row.writes] == [0, 1, 2]
    assert m.postprocess_spec("r", table, 9, 3, 2, 2) == []
    row = m.run_row("r", table, 11, TOKENS[11:12] + [97, 96], 2, spec_row=True)
    assert row.read_column == 1 and row.read_state == TRUTH.at(11)


def test_a_spec_row_with_nothing_computed_reads_zeros_as_the_initial_state():
    for held, expected in ((ZEROED, EMPTY), (TRUTH.at(3), TRUTH.at(3))):
        m = model()
        m.held[31] = held
        row = m.run_row("new", [31, 32, 33], 0, TOKENS[:1] + [99], 1, spec_row=True)
        assert row.read_state == expected


def test_default_runner_is_v2_unless_vllm_lists_an_unsupported_feature():
    from mambafuzz.sim.bridge.configs import default_runner

    assert default_runner(SimpleNamespace(_get_v2_model_runner_unsupported_features=lambda: [])) == "v2"
    assert default_runner(SimpleNamespace(_get_v2_model_runner_unsupported_features=lambda: ["x"])) == "v1"


def test_expected_tables_key_a_verdict_by_split_or_by_split_and_runner():
    import json

    import pytest

    from mambafuzz.model.scenario import RequestSpec, Scenario
    from mambafuzz.store.corpus import CaseError, expected_for, parse_case

    table = {"fixed": "clean", "fixed@v1": "uninit_read"}
    assert expected_for(table, "fixed", "v1") == "uninit_read"
    assert expected_for(table, "fixed", "v2") == "clean"
    assert expected_for(table, "prefix", "v1") is None
    raw = Scenario(requests=[RequestSpec()]).to_json()
    assert parse_case(json.dumps(dict(raw, expected=table)), "t").expected == table
    with pytest.raises(CaseError, match="split@runner"):
        parse_case(json.dumps(dict(raw, expected={"fixed@v3": "clean"})), "t")


def test_a_blocks_first_use_holds_the_zeros_the_cache_was_allocated_with():
    """The V1 padded one-token prompt of corpus/upstream/spec_pad_one_token_prompt_unzeroed_block/spec_pad_one_token_prompt_unzeroed_block.json
    without the finished request whose blocks it reuses: its block was never used, so the
    spec kernel's unmasked read finds zeros, the right initial state."""
    import dataclasses
    from pathlib import Path

    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.store.corpus import load_case

    case = load_case(Path(__file__).resolve().parents[2] / "corpus/upstream/spec_pad_one_token_prompt_unzeroed_block/spec_pad_one_token_prompt_unzeroed_block.json")
    fresh = dataclasses.replace(case.scenario, requests=case.scenario.requests[1:])
    assert evaluate(fresh, "fixed", efficiency=False, runner="v1").verdict.clean
    assert evaluate(case.scenario, "fixed", efficiency=False, runner="v1").verdict.kind == "uninit_read"


def test_a_prefill_kernel_row_stores_the_state_after_its_drafts_and_says_so():
    """V2's padded one-token prompt: the chunked kernel cannot roll placeholder drafts back."""
    m = model("v2")
    row = m.run_row("r", [41, 42], 0, TOKENS[:1] + [-1], 1, spec_row=False)
    assert row.read_state == EMPTY
    assert row.writes == [(0, 41, TRUTH.at(1).extend([-1]), "chunk-end+drafts")]
