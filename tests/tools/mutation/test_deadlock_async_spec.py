"""The async-load + spec-decode deadlock vllm-project/vllm#57104 fixed, planted back
(`deadlock_async_load_spec_slots_*`, mambafuzz/tools/mutation/planted.py): the harness and the
stall oracle see it on a hand-built case, which vLLM 0.32.0 runs clean.

Two requests arrive together, each served its whole prompt but one token by an asynchronous
connector load (a P/D decode instance's view), under MTP with one draft. vLLM parks both loads
(WAITING_FOR_REMOTE_KVS) holding their blocks; a finished load is promoted by a step that needs
its spec-decode slots (1 token + 1 padded draft + 1 lookahead slot), which the load itself did
not allocate (scheduler.py:1224-1227). On a 20-block pool r0's load takes 10 blocks; vLLM 0.32.0
keeps 2 free for the promotions (r0's remaining blocks counted with its spec slots, :3064-3065,
plus r1's own spec-step block, :1248-1251) and so defers r1's load; with both left out, r1's
9-block load takes the last free blocks, neither load can be promoted and nothing runs that
could be preempted: `stall:step-bound`.
"""

from pathlib import Path

import pytest

from mambafuzz.model.scenario import from_json
from mambafuzz.tools.mutation import kills

ROOT = Path(__file__).resolve().parents[3]


def two_parked_loads(pool: int, async_scheduling: bool) -> object:
    reqs = [{"arrival_step": 0, "prefix_ids": [], "unique_len": n, "max_tokens": 2, "external_tokens": n - 1,
             "external_async": True, "abort_step": None} for n in (64, 40)]
    return from_json({"format": "mambafuzz-scenario", "version": 1,
                      "engine": {"mamba_block_size": 16, "attn_block_size": 16, "max_num_batched_tokens": 256,
                                 "max_num_seqs": 4, "spec_method": "mtp", "num_speculative_tokens": 1,
                                 "num_gpu_blocks": pool, "async_scheduling": async_scheduling},
                      "prefixes": [], "requests": reqs, "acceptance": [], "token_seed": 0})


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_two_parked_loads_deadlock_without_the_spec_slots_reservation(async_scheduling):
    ok, why = kills.confirms_kill(two_parked_loads(20, async_scheduling), "fixed", "deadlock_async_load_spec_slots_both",
                                  signature="stall:step-bound")
    assert ok, why


@pytest.mark.parametrize("half", ["own", "others"])
def test_either_half_alone_keeps_one_promotion_free(half):
    """Each half of the reservation alone keeps one promotion's spec slots free (r1's own step
    blocks, or r0's remaining blocks with its slots): r0 is promoted, finishes and frees its
    blocks, then r1. Neither half alone stalls two parked loads here, nor in 105 hand-drawn
    families of two and three parked whole-prompt loads (2026-12-06)."""
    ok, why = kills.confirms_kill(two_parked_loads(20, False), "fixed", f"deadlock_async_load_spec_slots_{half}")
    assert not ok and why == "clean with the mutant", why


@pytest.mark.parametrize("half", ["own", "others"])
def test_either_half_alone_stalls_a_load_retried_behind_a_parked_one(half):
    """What the PR job found for each half alone (GENERATOR=random ci/pr-fuzz 120, 2026-12-06,
    from generated input at about 92 s; kept minimized): two 16- and 32-token prompts loaded
    whole but one token, MTP with 3 drafts, max_num_seqs 1, the first load failing under
    `recompute`. With either half undone vLLM admits r1's load beside r0's; r0's load fails, its
    retry at the head of the queue cannot fit beside r1's reservation, and r1, parked behind it,
    is never reached. vLLM 0.32.0 defers r1's load instead and runs the case clean."""
    from mambafuzz.store import corpus

    case = corpus.load_case(ROOT / "tests" / "data" / "deadlock_half_behind_failed_load.json")
    ok, why = kills.confirms_kill(case.scenario, "fixed", f"deadlock_async_load_spec_slots_{half}",
                                  signature="stall:step-bound")
    assert ok, why


def test_one_block_more_and_both_loads_are_promoted():
    ok, why = kills.confirms_kill(two_parked_loads(21, False), "fixed", "deadlock_async_load_spec_slots_both")
    assert not ok and why == "clean with the mutant", why
