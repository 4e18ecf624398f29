"""What vLLM 0.32.0's own V1 worker code does per row (mambafuzz/conform/v1.py), on hand-built steps.

Each test feeds the worker a step as the scheduler would hand it over and pins what vLLM's
functions decided: row kind per metadata builder, initial-state read, writes, copies.
MAMBA_BLOCK_SIZE is 64 throughout; TABLE columns are 0, 1, 2, ...
"""

from __future__ import annotations

import pytest

from mambafuzz.conform.rows import DECODE, PREFILL, SPEC_DECODE, RowInput, RowPlan, StepInput, Write
from mambafuzz.conform.v1 import V1Worker
from mambafuzz.conform.v2 import V2Worker
from mambafuzz.model.scenario import EngineConfig
from mambafuzz.sim.bridge import configs

MAMBA_BLOCK_SIZE = 64
NUM_BLOCKS = 64
TABLE = (5, 6, 7, 8, 9)  # the request's mamba block table: column c holds block TABLE[c]
OTHER = (20, 21, 22, 23)


RUNNERS = ("v1", "v2")


def make_worker(runner: str = "v1", temporal_tiles: int | None = 1, **engine) -> V1Worker | V2Worker:
    e = EngineConfig(mamba_block_size=MAMBA_BLOCK_SIZE, attn_block_size=MAMBA_BLOCK_SIZE,
                     max_num_batched_tokens=512, **engine)
    vc = configs.vllm_config_for(e, 1024)
    spec = configs.kv_cache_config_for(e, NUM_BLOCKS, 4096).kv_cache_groups[1].kv_cache_spec
    worker = V1Worker if runner == "v1" else V2Worker
    return worker(vc, spec, NUM_BLOCKS, hash_block_size=MAMBA_BLOCK_SIZE,
                    cache_hit_alignment_tokens=MAMBA_BLOCK_SIZE, max_model_len=1024,
                  temporal_tiles=temporal_tiles)


def row(rid: str, computed: int, scheduled: int, prompt: int, table=TABLE, drafts: int = 0, sampled: int = 1):
    return RowInput(rid, computed, scheduled, drafts, prompt, table, sampled)


def plans(worker: V1Worker | V2Worker, *rows: RowInput, **dropped) -> dict[tuple[str, str], RowPlan]:
    return {(p.mixer, p.req_id): p for p in worker.step(StepInput(tuple(rows), **dropped))}


@pytest.fixture(scope="module")
def plain() -> V1Worker:
    return make_worker()


@pytest.mark.parametrize("runner", RUNNERS)
def test_first_prefill_chunk_starts_from_zeros_and_writes_its_end_column(runner: str):
    w = make_worker(runner)
    got = plans(w, row("a", 0, 100, 200))
    for mixer in ("gdn", "mamba2"):
        p = got[mixer, "a"]
        assert (p.kind, p.has_initial_state, p.read_column, p.read_block) == (PREFILL, False, None, None)
        assert p.writes == (Write(1, 6, "final"),)  # cdiv(100, 64) - 1 = 1
        assert p.pre_copies == () and p.post_copies == ()


@pytest.mark.parametrize("runner", RUNNERS)
def test_mid_prefill_chunk_crossing_a_boundary_is_precopied_into_its_end_column(runner: str):
    w = make_worker(runner)
    plans(w, row("a", 0, 100, 200))
    got = plans(w, row("a", 100, 100, 200))
    for mixer in ("gdn", "mamba2"):
        p = got[mixer, "a"]
        # preprocess_mamba: mamba_state_idx 1 -> cdiv(200, 64) - 1 = 3, copies table[1] into table[3]
        assert p.pre_copies == ((6, 8),)
        assert (p.kind, p.has_initial_state, p.read_column, p.read_block) == (PREFILL, True, 3, 8)
        assert p.writes == (Write(3, 8, "final"),)


@pytest.mark.parametrize("runner", RUNNERS)
def test_plain_decode_reads_and_writes_the_running_column(runner: str):
    w = make_worker(runner)
    plans(w, row("a", 0, 130, 130))
    got = plans(w, row("a", 130, 1, 130))
    for mixer in ("gdn", "mamba2"):
        p = got[mixer, "a"]
        assert (p.kind, p.read_column, p.read_block, p.num_accepted) == (DECODE, 2, 7, 1)
        assert p.writes == (Write(2, 7, "final"),)
        assert p.pre_copies == ()


@pytest.mark.parametrize("runner", RUNNERS)
def test_spec_decode_row_writes_every_token_and_postcopies_the_crossed_boundary(runner: str):
    w = make_worker(runner, spec_method="mtp", num_speculative_tokens=2)
    plans(w, row("a", 0, 62, 62))
    # 1 real + 2 drafts from 62: running column moves 0 -> 1 (pre-copy); all 3 accepted
    got = plans(w, row("a", 62, 3, 62, drafts=2, sampled=3))
    for mixer in ("gdn", "mamba2"):
        p = got[mixer, "a"]
        assert (p.kind, p.read_column, p.read_block, p.num_accepted) == (SPEC_DECODE, 1, 6, 1)
        assert p.writes == (Write(1, 6, "spec-token"), Write(2, 7, "spec-token"), Write(3, 8, "spec-token"))
        assert p.pre_copies == ((5, 6),)
        # new computed 65: the state after 64 tokens (table[1 + 1]) moves into table[0]
        assert p.post_copies == ((7, 5),)
    nxt = plans(w, row("a", 65, 3, 62, drafts=2, sampled=1))
    for mixer in ("gdn", "mamba2"):
        p = nxt[mixer, "a"]
        # the accepted count survives (no reset: the boundary copy went to another column)
        assert (p.read_column, p.read_block, p.num_accepted) == (3, 8, 3)


# runner -> (num_accepted, read column, read block) after the skipped step; the true state is column 3
SKIPPED_STEP_READ = {"v1": (1, 1, 6), "v2": (3, 3, 8)}


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_spec_row_skipped_for_one_step(runner: str):
    """V1 drops unscheduled requests from its persistent batch (_update_states); re-adding one
    resets num_accepted_tokens_cpu to 1 (InputBatch.add_request) while mamba_state_idx survives,
    so its kernel reads the running column, not the accepted token's. V2 keeps the request's slot
    (and its accepted count) across the skipped step."""
    w = make_worker(runner, spec_method="mtp", num_speculative_tokens=2)
    plans(w, row("a", 0, 70, 70))
    got = plans(w, row("a", 70, 3, 70, drafts=2, sampled=3))  # accepts both drafts, no boundary crossed
    assert got["gdn", "a"].post_copies == ()
    plans(w, row("b", 0, 10, 10, table=OTHER))  # "a" not scheduled this step
    back = plans(w, row("a", 73, 3, 70, drafts=2))
    for mixer in ("gdn", "mamba2"):
        p = back[mixer, "a"]
        assert (p.num_accepted, p.read_column, p.read_block) == SKIPPED_STEP_READ[runner]


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_spec_row_scheduled_every_step_keeps_its_accepted_offset(runner: str):
    """The control for the test above: without the skipped step the kernel reads column 3."""
    w = make_worker(runner, spec_method="mtp", num_speculative_tokens=2)
    plans(w, row("a", 0, 70, 70))
    plans(w, row("a", 70, 3, 70, drafts=2, sampled=3))
    nxt = plans(w, row("a", 73, 3, 70, drafts=2))
    for mixer in ("gdn", "mamba2"):
        p = nxt[mixer, "a"]
        assert (p.num_accepted, p.read_column, p.read_block) == (3, 3, 8)


# (runner, computed) -> kind per mixer for a one-token prompt tail padded with 2 placeholder drafts
PADDED_TAIL_KINDS = {
    ("v1", 0): {"gdn": SPEC_DECODE, "mamba2": PREFILL},
    ("v1", 64): {"gdn": SPEC_DECODE, "mamba2": SPEC_DECODE},
    ("v2", 0): {"gdn": PREFILL, "mamba2": PREFILL},
    ("v2", 64): {"gdn": SPEC_DECODE, "mamba2": SPEC_DECODE},
}


@pytest.mark.parametrize("runner,computed", sorted(PADDED_TAIL_KINDS))
def test_one_token_prompt_tail_padded_with_placeholder_drafts(runner: str, computed: int):
    """The scheduler pads a one-token prompt tail with k -1 drafts (scheduler.py:1131-1153,
    1371-1374). With context before it, every builder of both runners runs it speculatively.
    A fresh one-token prompt (nothing computed) splits: V1's num_decode_draft_tokens
    (gpu_model_runner.py:2208-2210) makes it a GDN spec row, but Mamba2's padded_prompt_tail_rows
    needs prior state (mamba_attn.py `_compute_common_metadata`), and V2 runs a prefilling row as
    a decode only with computed prefill tokens (gpu/model_runner.py:1330), so those run a *prefill*
    over 1 real token + 2 placeholders and store its final state in the running column."""
    w = make_worker(runner, spec_method="mtp", num_speculative_tokens=2)
    if computed:
        plans(w, row("a", 0, computed, computed + 1))
    got = plans(w, row("a", computed, 3, computed + 1, drafts=2))
    col = computed // MAMBA_BLOCK_SIZE
    for mixer, kind in PADDED_TAIL_KINDS[runner, computed].items():
        p = got[mixer, "a"]
        assert p.kind == kind
        if kind == SPEC_DECODE:
            assert (p.has_initial_state, p.read_column, p.num_accepted, len(p.writes)) == (True, col, 1, 3)
        else:
            assert (p.has_initial_state, p.read_column) == (False, None)
            assert p.writes == (Write(0, 5, "final"),)  # the state after the placeholders


@pytest.mark.parametrize("runner", RUNNERS)
def test_internal_prefill_checkpoint_row(runner: str):
    w = make_worker(runner, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=16)
    got = plans(w, row("a", 0, 201, 201))
    m2 = got["mamba2", "a"]
    # compute_mamba_prefill_checkpoints: position 192 (3 blocks), column cdiv(201, 64) - 2 = 2
    assert m2.checkpoint_offset == 192
    assert m2.writes == (Write(3, 8, "final"), Write(2, 7, "checkpoint"))
    assert got["gdn", "a"].writes == (Write(3, 8, "final"),)  # Qwen's GDN mixer ignores the checkpoint


def test_finished_request_is_forgotten(plain: V1Worker):
    plans(plain, row("z", 0, 100, 300))
    assert plain.mamba_state_idx["z"] == 1
    plans(plain, row("y", 0, 10, 10, table=OTHER), finished=frozenset({"z"}))
    assert "z" not in plain.mamba_state_idx and "z" not in plain.input_batch.req_id_to_index


def test_drive_yields_vllms_rows_for_a_prefix_hit():
    """Through the real scheduler: the second request is admitted with 192 tokens cached, and
    vLLM's pre-copy moves the cached state (column 2) into its running column 3."""
    from mambafuzz.conform.drive import drive
    from mambafuzz.model.scenario import RequestSpec, Scenario

    s = Scenario(engine=EngineConfig(mamba_block_size=MAMBA_BLOCK_SIZE, attn_block_size=16, max_num_batched_tokens=256),
                 prefixes=[3 * MAMBA_BLOCK_SIZE + 10],
                 requests=[RequestSpec(prefix_ids=[0], unique_len=5, max_tokens=3),
                           RequestSpec(arrival_step=6, prefix_ids=[0], unique_len=7, max_tokens=3)])
    steps = {st.step: st for st in drive(s)}
    assert sorted(st for st in steps if steps[st].input.rows) == [0, 1, 2, 3, 6, 7, 8, 9]
    assert all(steps[st].input.finished for st in steps if not steps[st].input.rows)  # steps that only drop
    hit = steps[6]
    (r1,) = hit.input.rows
    assert (r1.req_id, r1.num_computed, r1.num_scheduled) == ("r1", 192, 16)
    p = next(p for p in hit.plans if p.mixer == "gdn")
    cached, running = r1.block_ids[2], r1.block_ids[3]
    assert p.pre_copies == ((cached, running),)
    assert (p.kind, p.has_initial_state, p.read_column, p.read_block) == (PREFILL, True, 3, running)


@pytest.mark.parametrize("runner", RUNNERS)
def test_one_copy_tile_decides_like_vllms_sixteen(runner: str):
    """The interpreter runs the fused copies with one temporal tile (fast); vLLM's 16 tiles only
    split each copy's bytes, so the plans are identical."""
    def run(tiles):
        w = make_worker(runner, temporal_tiles=tiles, spec_method="mtp", num_speculative_tokens=2)
        steps = [(row("a", 0, 62, 62),), (row("a", 62, 3, 62, drafts=2, sampled=3),),
                 (row("a", 65, 3, 62, drafts=2, sampled=2),)]
        return [plans(w, *rows) for rows in steps]

    fast, vllm = run(1), run(None)
    assert fast == vllm
    assert fast[1]["gdn", "a"].post_copies == ((7, 5),)


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_step_without_rows_still_drops_finished_requests(runner: str):
    w = make_worker(runner)
    plans(w, row("a", 0, 100, 300))
    assert w.step(StepInput((), finished=frozenset({"a"}))) == []
    held = w.input_batch.req_id_to_index if runner == "v1" else w.slots
    assert "a" not in held


def test_the_real_scheduler_pads_a_fresh_one_token_prompt():
    """Through the real scheduler: a 1-token prompt arriving while another request decodes is
    scheduled with 2 placeholder drafts and nothing computed; the classifications of
    PADDED_TAIL_KINDS[(runner, 0)] hold on that row."""
    from mambafuzz.conform.drive import drive
    from mambafuzz.model.scenario import RequestSpec, Scenario

    s = Scenario(engine=EngineConfig(mamba_block_size=MAMBA_BLOCK_SIZE, attn_block_size=16, max_num_batched_tokens=64,
                                     spec_method="mtp", num_speculative_tokens=2),
                 requests=[RequestSpec(unique_len=20, max_tokens=10), RequestSpec(arrival_step=3, unique_len=1, max_tokens=4)],
                 acceptance=[1])
    padded = [(st, r) for st in drive(s) for r in st.input.rows if r.req_id == "r1" and r.num_drafts]
    st, r = padded[0]
    assert (r.num_computed, r.num_scheduled, r.num_drafts, r.num_prompt_tokens) == (0, 3, 2, 1)
    kinds = {(p.runner, p.mixer): p.kind for p in st.plans if p.req_id == "r1"}
    assert kinds == {(runner, mixer): kind for runner in RUNNERS
                     for mixer, kind in PADDED_TAIL_KINDS[runner, 0].items()}


def test_the_real_scheduler_skips_a_spec_row_and_v1_copies_a_stale_state():
    """Through the real scheduler (mamba block 8, budget 10, MTP k = 2): r1 decodes beside r0's
    chunked prefill, accepts a draft (the state after 7 tokens sits in column 1, accepted count 2),
    is left out while r0's last chunk takes the whole budget, and comes back crossing into column 1.
    V1 re-added it with accepted count 1, so its pre-copy moves column 0 (the state after 6
    tokens) over column 1, which the kernel then reads at 7 computed tokens. V2 copies column 1
    onto itself (invisible) and reads the right state."""
    from mambafuzz.conform.drive import drive
    from mambafuzz.model.scenario import RequestSpec, Scenario

    s = Scenario(engine=EngineConfig(mamba_block_size=8, attn_block_size=8, max_num_batched_tokens=10, max_num_seqs=4,
                                     spec_method="mtp", num_speculative_tokens=2),
                 requests=[RequestSpec(unique_len=42, max_tokens=4), RequestSpec(unique_len=1, max_tokens=20)],
                 acceptance=[1])
    steps = {st.step: st for st in drive(s)}
    assert [r.req_id for r in steps[4].input.rows] == ["r0"]  # r1 left out
    (r1,) = [r for r in steps[5].input.rows if r.req_id == "r1"]
    assert (r1.num_computed, r1.num_scheduled, r1.num_drafts) == (7, 3, 2)
    col0, col1 = r1.block_ids[0], r1.block_ids[1]
    got = {(p.runner, p.mixer): p for p in steps[5].plans if p.req_id == "r1"}
    for mixer in ("gdn", "mamba2"):
        assert got["v1", mixer].pre_copies == ((col0, col1),)
        assert got["v2", mixer].pre_copies == ()
        assert got["v1", mixer].read_block == got["v2", mixer].read_block == col1


@pytest.mark.parametrize("load_async", [False, True])
def test_a_connector_load_leaves_a_one_token_tail_padded_with_state(load_async: bool):
    """Through the real scheduler and the driven connector: under MTP a prefix hit never leaves a
    one-token prompt remainder (the EAGLE block drop), but a connector that loads all but the last
    prompt token does, and vLLM pads that tail at admission (scheduler.py:1131-1153). The drive
    must load what the scenario scripts, or the padded tail with prior state is never reached."""
    from mambafuzz.conform.drive import drive
    from mambafuzz.conform.row_classes import PADDED_TAIL_WITH_STATE, row_class
    from mambafuzz.model.scenario import RequestSpec, Scenario

    s = Scenario(engine=EngineConfig(mamba_block_size=16, attn_block_size=16, max_num_batched_tokens=64,
                                     spec_method="mtp", num_speculative_tokens=2),
                 prefixes=[32],
                 requests=[RequestSpec(prefix_ids=[0], unique_len=5, max_tokens=3),
                           RequestSpec(arrival_step=4, prefix_ids=[0], unique_len=6, max_tokens=3,
                                       external_tokens=37, external_async=load_async)],
                 acceptance=[1])
    tails = [r for st in drive(s) for r in st.input.rows if r.req_id == "r1" and r.num_computed == 37]
    assert tails, "r1 never ran from the loaded prefix"
    r = tails[0]
    assert (r.num_scheduled, r.num_drafts, r.num_prompt_tokens) == (3, 2, 38)
    assert row_class(r, 2) == PADDED_TAIL_WITH_STATE
