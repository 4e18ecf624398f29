"""Each oracle check fires on a trace built to violate it and stays silent on a clean one."""

from mambafuzz.checks import oracle
from mambafuzz.findings import (
    Inefficiency,
    NocacheStaleRead,
    OutputDivergence,
    ResumeStateMismatch,
    SlotHashMismatch,
    StaleStateRead,
    Stall,
    UninitRead,
    VllmCrash,
)
from mambafuzz.sim.state import EMPTY, PrefixStates
from mambafuzz.sim.trace import CacheEntry, Chunk, Crash, SlotWrite, StepRecord, Trace

TOKENS = list(range(1, 40))
TRUTH = PrefixStates(TOKENS)


def chunk(start, n, read_state=None, first=False):
    return Chunk("r0", start, n, 0, 0, 7, read_state or TRUTH.at(start), TRUTH.at(start), first, first and start > 0)


def clean_trace() -> Trace:
    t = Trace(split="fixed", prefix_caching=True, step_bound=50)
    t.steps = [
        StepRecord(0, chunks=[chunk(0, 16)], writes=[SlotWrite("r0", 0, 7, TRUTH.at(16), "chunk-end")],
                   cache=[CacheEntry(7, 0, TRUTH.at(16), TRUTH.at(16), "r0", True, True, 16)]),
        StepRecord(1, chunks=[chunk(16, 4)]),
    ]
    t.outputs = {"r0": [5, 6]}
    t.finish_status = {"r0": "FINISHED_LENGTH_CAPPED"}
    return t


def test_clean_trace_is_clean():
    t = clean_trace()
    v = oracle.judge(t, clean_trace(), clean_trace())
    assert v.clean and not v.reports and v.kind == "clean"


def test_slot_hash_fires_on_poisoned_block_and_names_the_writer():
    t = clean_trace()
    t.steps[0].writes = [SlotWrite("r0", 0, 7, TRUTH.at(10), "chunk-end")]
    t.steps[0].cache = [CacheEntry(7, 0, TRUTH.at(16), TRUTH.at(10), "r0", True, True, 16)]
    f = oracle.check_slot_hashes(t)
    assert isinstance(f, SlotHashMismatch)
    assert f.signature == "slot_hash:short/chunk-end"
    assert "block 7 (slot 0 of r0)" in f.message and "after 16 tokens" in f.message and "state@10" in f.message
    assert "last written at step 0 by r0 [chunk-end]" in f.message


def test_slot_hash_labels_a_mid_block_crossing_in_a_checkpointing_engine_as_the_checkpoint_class():
    """A chunk 4..20 over 16-token blocks published as state@16 while holding state@4: "+ckpt"
    when the engine exports internal prefill checkpoints (the exemption class, even when the
    clipped chunk wrote no checkpoint), or when the crossing row wrote one; plain otherwise."""
    def poisoned(internal_checkpoints, writes_checkpoint=False):
        t = Trace(split="fixed", prefix_caching=True, step_bound=50, mamba_block_size=16,
                  internal_checkpoints=internal_checkpoints)
        writes = [SlotWrite("r0", 0, 7, TRUTH.at(4), "connector")]
        if writes_checkpoint:
            writes.append(SlotWrite("r0", 1, 8, TRUTH.at(20), "checkpoint"))
        t.steps = [StepRecord(0, chunks=[chunk(4, 16)], writes=writes,
                              cache=[CacheEntry(7, 0, TRUTH.at(16), TRUTH.at(4), "r0", True, True, 16)])]
        return oracle.check_slot_hashes(t).signature

    assert poisoned(internal_checkpoints=False) == "slot_hash:short/connector"
    assert poisoned(internal_checkpoints=True) == "slot_hash:short/connector+ckpt"
    assert poisoned(internal_checkpoints=False, writes_checkpoint=True) == "slot_hash:short/connector+ckpt"


def test_slot_hash_fires_on_wrong_recorded_count():
    t = clean_trace()
    t.steps[0].cache = [CacheEntry(7, 0, TRUTH.at(16), TRUTH.at(16), "r0", True, True, 32)]
    assert oracle.check_slot_hashes(t).location == "recorded-count"


def test_resume_fires_on_a_wrong_hit_and_stale_read_on_a_running_row():
    t = clean_trace()
    t.steps[0].chunks = [chunk(16, 4, read_state=TRUTH.at(12), first=True)]
    f = oracle.check_reads(t)
    assert isinstance(f, ResumeStateMismatch) and "resumed at 16 tokens" in f.message
    t.steps[0].chunks = [chunk(16, 4, read_state=EMPTY.extend([99] * 16))]
    f = oracle.check_reads(t)
    assert isinstance(f, StaleStateRead) and f.location == "foreign"


def test_output_divergence_ignores_aborted_requests():
    a, b = clean_trace(), clean_trace()
    b.outputs = {"r0": [5, 9]}
    f = oracle.check_outputs(a, b)
    assert isinstance(f, OutputDivergence) and "output token 1" in f.message
    a.finish_status["r0"] = "FINISHED_ABORTED"
    assert oracle.check_outputs(a, b) is None


def test_a_request_that_only_stopped_short_is_a_stall_not_a_divergence():
    """The cached run left r0 unfinished after one of the two tokens the other run gave it: the
    headline is the stall, the cause; a token that differs is still a divergence."""
    cached, uncached = clean_trace(), clean_trace()
    cached.outputs, cached.unfinished = {"r0": [5]}, ["r0"]
    v = oracle.judge(cached, uncached)
    assert v.kind == "stall" and [f.kind for f in v.findings] == ["stall"]
    cached.outputs = {"r0": [7]}  # stalled, and generated something else first
    assert [f.kind for f in oracle.judge(cached, uncached).findings] == ["output_divergence", "stall"]
    cached.unfinished = []  # finished short: a different completion
    cached.outputs = {"r0": [5]}
    assert isinstance(oracle.check_outputs(cached, uncached), OutputDivergence)


def test_stall_and_crash():
    t = clean_trace()
    t.unfinished = ["r0"]
    assert isinstance(oracle.check_liveness(t), Stall)
    t = clean_trace()
    t.crash = Crash("AssertionError", "boom", "vllm/v1/core/x.py:12 in f", 3)
    f = oracle.check_crash(t)
    assert isinstance(f, VllmCrash) and f.signature == "vllm_crash:AssertionError@vllm/v1/core/x.py:f"
    assert oracle.judge(t).kind == "vllm_crash"


def test_efficiency_is_report_only_unless_strict():
    cand, ref = clean_trace(), clean_trace()
    cand.forward_steps, ref.forward_steps = 5, 3
    v = oracle.judge(cand, reference=ref)
    assert v.clean and isinstance(v.reports[0], Inefficiency)
    assert not oracle.judge(cand, reference=ref, strict_efficiency=True).clean


def test_reads_the_uncached_run_shares_are_runner_bugs_not_prefix_cache_poisoning():
    """A row with nothing computed that reads its block is uninit_read; a wrong read the
    mamba_cache_mode none run makes on the same row is nocache_stale_read; one only that run
    makes is filed with a nocache- location; and output_divergence skips such requests."""
    garbage = EMPTY.extend([99] * 3)

    def with_read(start, state):
        t = clean_trace()
        t.steps[1].chunks = [chunk(start, 4, read_state=state)]
        return t

    cached, uncached = with_read(0, garbage), with_read(0, garbage)
    f = oracle.check_reads(cached, uncached)
    assert isinstance(f, UninitRead) and f.signature == "uninit_read:from-empty"
    assert oracle.check_reads(cached, clean_trace()).signature == "uninit_read:from-empty"
    assert oracle.check_nocache_reads(uncached, clean_trace()).signature == "uninit_read:from-empty"
    cached, uncached = with_read(16, TRUTH.at(17)), with_read(16, TRUTH.at(17))
    f = oracle.check_reads(cached, uncached)
    assert isinstance(f, NocacheStaleRead) and f.signature == "nocache_stale_read:long"
    assert isinstance(oracle.check_reads(cached, clean_trace()), StaleStateRead)
    f = oracle.check_nocache_reads(uncached, clean_trace())
    assert f.signature == "nocache_stale_read:nocache-long" and f.message.startswith("prefix caching off: ")
    assert oracle.check_nocache_reads(uncached, cached) is None  # judged on the cached run instead
    uncached.outputs = {"r0": [5, 9]}
    assert oracle.check_outputs(clean_trace(), uncached) is None
    assert oracle.judge(clean_trace(), uncached).kind == "nocache_stale_read"


def test_a_state_left_by_a_prefill_row_that_kept_its_drafts_has_one_signature_in_either_run():
    """A prefill-kernel row with drafts stores the state after them (cause chunk-end+drafts); the
    next row that reads it is the runner's doing, whether or not the uncached schedule shows it."""
    t = clean_trace()
    t.steps[0].writes = [SlotWrite("r0", 0, 7, TRUTH.at(17), "chunk-end+drafts")]
    t.steps[1].chunks = [chunk(16, 4, read_state=TRUTH.at(17))]
    f = oracle.check_reads(t, clean_trace())
    assert isinstance(f, NocacheStaleRead) and f.signature == "nocache_stale_read:long/prefill-kept-drafts"
    assert oracle.check_nocache_reads(t, clean_trace()).signature == f.signature
    t.steps[0].writes = [SlotWrite("r0", 0, 7, TRUTH.at(17), "chunk-end")]
    assert isinstance(oracle.check_reads(t, clean_trace()), StaleStateRead)


def test_the_first_row_after_v1_reset_an_accepted_count_is_the_runners_doing():
    t = clean_trace()
    t.steps[1].chunks = [chunk(16, 4, read_state=TRUTH.at(15))]
    assert isinstance(oracle.check_reads(t, clean_trace()), StaleStateRead)
    t.after_accepted_reset = {(1, "r0")}
    f = oracle.check_reads(t, clean_trace())
    assert isinstance(f, NocacheStaleRead) and f.signature == "nocache_stale_read:short/accepted-reset"
    other = clean_trace()
    other.outputs = {"r0": [5, 9]}
    assert oracle.check_outputs(t, other) is None  # explained by the read, not by prefix caching


def _poisoned_by(stop_tokens: int, budget: int, threshold: int, admission_hit: int):
    """A slot published as state@16 holding state@10, written at the end of a chunk 0..10 of r0
    (prompt 30); what ended that chunk and how r0 was admitted are the parameters."""
    from mambafuzz.sim.trace import Admission

    t = Trace(split="fixed", prefix_caching=True, step_bound=50, mamba_block_size=16, prompt_lens={"r0": 30},
              token_budget=budget, long_prefill_threshold=threshold)
    t.steps = [StepRecord(0, admissions=[Admission("r0", admission_hit, 0, False)], chunks=[chunk(0, stop_tokens)],
                          writes=[SlotWrite("r0", 0, 7, TRUTH.at(10), "chunk-end")],
                          cache=[CacheEntry(7, 0, TRUTH.at(16), TRUTH.at(10), "r0", True, True, 16)])]
    return oracle.check_slot_hashes(t)


def test_same_coarse_signature_different_mechanism_gets_different_fine_signatures():
    """Two bugs that poison a slot the same way (`slot_hash:short/chunk-end`): one chunk ended on
    the token budget, the other on the long-prefill threshold; a third differs in admission."""
    by_budget = _poisoned_by(10, budget=10, threshold=0, admission_hit=0)
    by_threshold = _poisoned_by(10, budget=64, threshold=10, admission_hit=0)
    after_hit = _poisoned_by(10, budget=10, threshold=0, admission_hit=16)
    assert by_budget.signature == by_threshold.signature == after_hit.signature == "slot_hash:short/chunk-end"
    assert by_budget.fine_signature == "slot_hash:short/chunk-end|token-budget,fresh,chunk-end"
    assert by_threshold.fine_signature == "slot_hash:short/chunk-end|long-prefill,fresh,chunk-end"
    assert after_hit.fine_signature == "slot_hash:short/chunk-end|token-budget,prefix-hit,chunk-end"
    assert by_budget.to_json()["fine_signature"] == by_budget.fine_signature


def test_chunk_stop_names_what_ended_a_chunk():
    t = Trace(split="fixed", prefix_caching=True, step_bound=50, mamba_block_size=16, prompt_lens={"r0": 30},
              token_budget=64)
    rec = StepRecord(0)
    assert oracle.chunk_stop(t, rec, chunk(16, 14)) == "request-end"
    assert oracle.chunk_stop(t, rec, chunk(30, 1)) == "decode"
    assert oracle.chunk_stop(t, rec, chunk(0, 16)) == "block-end"
    assert oracle.chunk_stop(t, rec, chunk(0, 10)) == "mid-block"
