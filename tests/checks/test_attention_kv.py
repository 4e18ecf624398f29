"""The attention blocks a prefix-cache hit serves are judged: each must hold the K/V of the request's
own prefix up to its end (mambafuzz.sim.engine.attention_kv, mambafuzz.checks.attention_kv)."""

from __future__ import annotations

from types import SimpleNamespace

from mambafuzz.checks import attention_kv as check
from mambafuzz.checks import pipeline
from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario
from mambafuzz.sim.engine.attention_kv import AttentionBlocks
from mambafuzz.sim.state import PrefixStates
from mambafuzz.sim.trace import Trace
from mambafuzz.sim.worker.worker_tables import WorkerTables

NULL = 0


def _blocks(block_size: int = 4) -> tuple[AttentionBlocks, Trace]:
    trace = Trace(split="fixed", prefix_caching=True, group_kinds=("FullAttentionSpec", "mamba"),
                  group_block_sizes=(block_size, 8))
    told = WorkerTables((), "v2", side_groups=(0,))  # the harness's one pass keeps the attention group aside
    return AttentionBlocks(told, trace.group_block_sizes, NULL, trace), trace


def _new(rid: str, blocks: list[int], computed: int = 0) -> SimpleNamespace:
    """A SchedulerOutput with one new request (the attention group's block ids only)."""
    cached = SimpleNamespace(req_ids=[], new_block_ids=[], num_computed_tokens=[], resumed_req_ids=set())
    new = SimpleNamespace(req_id=rid, block_ids=(blocks,), num_computed_tokens=computed)
    return SimpleNamespace(finished_req_ids=set(), preempted_req_ids=set(), scheduled_new_reqs=[new],
                           scheduled_cached_reqs=cached)


def test_a_hit_on_blocks_the_request_computed_is_clean():
    attn, trace = _blocks()
    truth = PrefixStates(list(range(1, 13)))
    attn.told.update(_new("a", [5, 6, 7]))
    attn.written("a", 0, 12, truth)
    attn.told.update(_new("b", [5, 6, 9], computed=8))
    attn.judge_hit(3, "b", 8, PrefixStates(list(range(1, 13))))
    assert trace.attention_stale_hits == [] and check.check_attention_hits(trace) is None


def test_a_block_keyed_but_never_computed_is_a_stale_hit():
    attn, trace = _blocks()
    truth = PrefixStates(list(range(1, 13)))
    attn.told.update(_new("a", [5, 6, 7]))
    attn.written("a", 0, 6, truth)  # the chunk 6..12 never ran: block 6 is not complete, block 7 untouched
    attn.told.update(_new("b", [5, 6, 7], computed=12))
    attn.judge_hit(4, "b", 12, PrefixStates(list(range(1, 13))))
    assert trace.attention_stale_hits == [(4, "b", 0, 1, 6, 8, False)]
    finding = check.check_attention_hits(trace)
    assert finding.signature == "attention_kv:stale-hit/FullAttentionSpec" and finding.mechanism == "never-computed"


def test_a_block_holding_another_prefix_is_a_stale_hit():
    attn, trace = _blocks()
    attn.told.update(_new("a", [5, 6]))
    attn.written("a", 0, 8, PrefixStates([9] * 8))
    attn.told.update(_new("b", [5, 6], computed=8))
    attn.judge_hit(2, "b", 8, PrefixStates(list(range(1, 9))))
    assert trace.attention_stale_hits[0][-1] is True
    assert check.check_attention_hits(trace).mechanism == "other-prefix"


def test_accepted_drafts_complete_a_block_before_the_truth_holds_them():
    """A synchronous row's accepted drafts are past what the request's truth holds yet; a block they
    complete holds the sequence's K/V all the same."""
    attn, trace = _blocks()
    tokens = list(range(1, 9))
    truth = PrefixStates(tokens[:6])
    attn.told.update(_new("a", [5, 6]))
    attn.written("a", 0, 6, truth, beyond=tokens[6:8])
    attn.told.update(_new("b", [5, 6], computed=8))
    attn.judge_hit(1, "b", 8, PrefixStates(tokens))
    assert trace.attention_stale_hits == []


def test_null_columns_and_partial_blocks_are_not_judged():
    attn, trace = _blocks()
    truth = PrefixStates(list(range(1, 11)))
    attn.told.update(_new("a", [NULL, 6, 7]))
    attn.written("a", 4, 10, truth)
    attn.told.update(_new("b", [NULL, 6, 7], computed=10))
    attn.judge_hit(1, "b", 10, PrefixStates(list(range(1, 11))))  # column 2 covers 8..12: partial, not judged
    assert trace.attention_stale_hits == []


def test_hits_on_blocks_the_requests_computed_stay_clean_end_to_end():
    """Requests sharing a prefix, one after another: every hit serves blocks an earlier forward computed."""
    s = Scenario(EngineConfig(mamba_block_size=16, attn_block_size=16, max_num_batched_tokens=64, async_scheduling=False),
                 prefixes=[100], requests=[RequestSpec(0, [0], 10, 2), RequestSpec(0, [0], 12, 2),
                                           RequestSpec(6, [0], 30, 2)], token_seed=1)
    ev = pipeline.evaluate(s)
    assert any(a.local_hit_tokens for rec in ev.trace.steps for a in rec.admissions)
    assert ev.trace.attention_stale_hits == [] and ev.verdict.clean
