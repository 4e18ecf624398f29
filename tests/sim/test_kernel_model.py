"""The kernel model's rules, each on a tiny block table (block size 4)."""

from mambafuzz.sim.state import EMPTY, PrefixStates, State
from mambafuzz.sim.worker.kernel_model import UNSET, ZEROED, KernelGeometry, KernelModel

TOKENS = list(range(1, 30))
TRUTH = PrefixStates(TOKENS)


def model(runner="v1", mixer="gdn", **kw):
    g = dict(block_size=4, hash_block_size=4, checkpoint_alignment=None, cache_hit_alignment_tokens=4,
             drop_eagle_block=False, null_block_id=0, vocab_size=1024)
    g.update(kw)
    return KernelModel(KernelGeometry(**g), runner=runner, mixer=mixer)


def test_chunk_end_write_only_no_boundary_states_inside_a_chunk():
    m = model()
    table = [11, 12, 13]
    row = m.run_row("r", table, 0, TOKENS[:10], 0)
    assert row.read_state == EMPTY
    assert m.state_of(13) == TRUTH.at(10)  # curr = cdiv(10, 4) - 1 = 2
    assert m.state_of(11).num_tokens < 0 and m.state_of(12).num_tokens < 0


def test_precopy_carries_the_running_state_into_the_new_column():
    m = model()
    table = [0, 12, 13]  # slot 0 already retired to the null block
    m.run_row("r", table, 0, TOKENS[:6], 0)  # ends mid block 1
    assert m.state_of(12) == TRUTH.at(6)
    row = m.run_row("r", table, 6, TOKENS[6:10], 0)  # crosses into column 2
    assert row.read_column == 2 and row.read_state == TRUTH.at(6)
    assert m.state_of(12) == TRUTH.at(6)  # the slot for 8 tokens never gets state@8
    assert m.state_of(13) == TRUTH.at(10)


def test_hit_resume_reads_the_hit_column():
    m = model()
    m.held[21] = TRUTH.at(8)
    row = m.run_row("new", [0, 21, 22], 8, TOKENS[8:11], 0)  # prev = (8-1)//4 = 1, curr = 2
    assert row.read_state == TRUTH.at(8) and m.state_of(22) == TRUTH.at(11)


def test_spec_decode_writes_one_state_per_token_and_postcopy_moves_the_boundary():
    m = model()
    table = [0, 32, 33, 34, 35]  # cdiv(10, 4) + 2 speculative blocks
    m.held[32] = TRUTH.at(7)
    m._prev_column["r"] = 1
    # c = 7, token 7 (real) + two drafts; seq_len 10 so curr = 2: precopy slot 1 -> 2, then
    # the states after 8, 9, 10 tokens go to columns 2, 3, 4.
    row = m.run_row("r", table, 7, TOKENS[7:10], 2, spec_row=True)
    assert [(w[0], w[3]) for w in row.writes] == [(2, "precopy"), (2, "spec-token"), (3, "spec-token"),
                                                  (4, "spec-token")]
    assert row.read_state == TRUTH.at(7) and len(row.outputs) == 3
    # Two accepted (one draft + bonus): computed 9; the boundary 8 lies in (8 - 1, 9]:
    # state@8 (column 2 + bias 0) is copied to slot 8 // 4 - 1 = 1.
    writes = m.postprocess_spec("r", table, 7, 3, 2, 2)
    assert writes == [(1, 32, TRUTH.at(8), "postcopy")]
    # The next step reads column curr + accepted - 1 after its own precopy.
    row = m.run_row("r", table + [36], 9, TOKENS[9:12], 2, spec_row=True)  # seq_len 12, curr 2 == prev: no copy
    assert row.read_column == 3 and row.read_state == TRUTH.at(9)


def test_zero_copy_and_null_block_writes():
    m = model()
    m.zero_blocks([5])
    assert m.state_of(5) == ZEROED
    m.held[6] = TRUTH.at(4)
    m.copy_blocks([(6, 5)])
    assert m.state_of(5) == TRUTH.at(4)
    m.run_row("r", [0], 0, TOKENS[:3], 0)
    assert 0 not in m.held


def test_checkpoint_rule_writes_the_aligned_position_one_column_back():
    m = model(checkpoint_alignment=1, hash_block_size=4, cache_hit_alignment_tokens=4)
    table = [41, 42, 43]
    # chunk 0..10: position = floor((10-1)/4)*4 = 8; column cdiv(10,4)-2 = 1
    row = m.run_row("r", table, 0, TOKENS[:10], 0)
    assert (1, 42, TRUTH.at(8), "checkpoint") in row.writes


def test_a_zero_draft_decode_in_a_spec_engine_runs_on_the_speculative_path():
    """gpu_model_runner.py `zero_draft_decode_mask`: a one-token decode with no drafts still
    starts from the accepted-token offset (found by the long fuzz run on `fixed`)."""
    spec = model(spec_engine=True, num_speculative_tokens=1)
    assert spec.is_spec_row(num_computed=4, num_scheduled=1, num_drafts=0, num_prompt_tokens=1)
    assert not model().is_spec_row(4, 1, 0, 1)
    assert not spec.is_spec_row(0, 1, 0, 1)  # the prompt's own token
    assert spec.is_spec_row(0, 2, 1, 1)  # a padded one-token prompt (V1)
    m = model()
    table = [51, 52, 53]
    m.held[51], m.held[52] = TRUTH.at(3), TRUTH.at(4)
    m._prev_column["r"], m._num_accepted["r"] = 0, 2  # last step accepted a draft: state@4 in column 1
    row = m.run_row("r", table, 4, TOKENS[4:5], 0, spec_row=True)
    assert row.read_column == 1 and row.read_state == TRUTH.at(4)


def test_truth_shortcut_gives_exactly_what_token_by_token_extension_gives():
    """PrefixStates.span answers from the chain only for the true state at the span's start;
    a wrong count, a wrong fingerprint or a sentinel fall back to extending."""
    cases = [
        (TRUTH.at(3), 3, 9),  # the common case: served from the chain
        (TRUTH.at(2), 3, 9),  # a truncated state running the next chunk's tokens
        (EMPTY, 5, 8),  # an empty state mid-sequence
        (State(3, TRUTH.at(3).fingerprint ^ 1), 3, 9),  # right count, other tokens
        (TRUTH.at(4), 4, len(TOKENS)),  # up to the end of the chain
        (ZEROED, 0, 4),
        (UNSET, 2, 5),
    ]
    for start, begin, end in cases:
        assert TRUTH.span(start, begin, end) == start.extend(TOKENS[begin:end]), (start, begin, end)
    assert TRUTH.span(TRUTH.at(3), 3, 9) == TRUTH.at(9)


def test_rows_run_with_the_truth_give_what_rows_run_without_it_give():
    """The harness passes each row its request's truth; a poisoned slot, drafts and a
    checkpoint must still come out exactly as token-by-token extension makes them."""
    rows = [  # (rid, table, num_computed, tokens, num_drafts, spec_row)
        ("a", [11, 12, 13, 14], 0, TOKENS[:6], 0, False),
        ("a", [11, 12, 13, 14], 6, TOKENS[6:13], 0, False),  # checkpoint geometry below
        ("b", [0, 12, 21, 22], 8, TOKENS[8:11], 0, False),  # resumes from block 12 (holds state@6)
        ("a", [11, 12, 13, 14], 13, TOKENS[13:14] + [99, 98], 2, True),
        ("a", [11, 12, 13, 14], 14, TOKENS[14:15] + [97], 1, False),  # drafts on the plain path
        ("c", [31, 32, 33, 34, 35], 12, TOKENS[12:14] + [97, 96, 95], 3, False),  # a checkpoint among drafts
    ]
    for geometry in ({}, {"checkpoint_alignment": 4}):
        with_truth, without = model(**geometry), model(**geometry)
        for rid, table, start, tokens, drafts, spec in rows:
            a = with_truth.run_row(rid, table, start, tokens, drafts, spec, TRUTH)
            b = without.run_row(rid, table, start, tokens, drafts, spec)
            assert a == b, (rid, start)
        assert with_truth.held == without.held


def test_the_model_reports_which_blocks_it_wrote_since_it_was_last_asked():
    m = model()
    m.run_row("r", [11, 12, 13], 0, TOKENS[:6], 0)
    m.zero_blocks([20])
    assert m.take_dirty() == {12, 20}
    assert m.take_dirty() == set()
