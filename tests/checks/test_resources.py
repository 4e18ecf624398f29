"""The resource oracles (mambafuzz/checks/resources.py): each stays silent on unmodified vLLM
for an input built to exercise it and fires, attributed, when a small resource bug is planted
in vLLM (mambafuzz/tools/mutation/planted.py `resource_*`); the checkpoint rule is held to vLLM's own."""

import pytest

from mambafuzz.checks import resources
from mambafuzz.checks.pipeline import evaluate
from mambafuzz.model.scenario import from_json
from mambafuzz.sim import patching
from mambafuzz.sim.bridge.vllm_compat.api import get_mamba_prefill_checkpoint_position
from mambafuzz.sim.trace import Admission, Chunk, StepRecord, Trace
from mambafuzz.tools.mutation import planting


def scenario(engine: dict, requests: list[dict], prefixes=()) -> object:
    reqs = [{"arrival_step": 0, "prefix_ids": [], "unique_len": 0, "max_tokens": 2, "external_tokens": 0,
             "external_async": False, "abort_step": None, **r} for r in requests]
    return from_json({"format": "mambafuzz-scenario", "version": 1,
                      "engine": {"async_scheduling": False, **engine}, "prefixes": list(prefixes),
                      "requests": reqs, "acceptance": [], "token_seed": 0})


# A prompt sent again, with more tokens, after its first request finished (a continuation that
# takes none of its outputs): the second is served the first prompt's checkpoint.
RESEND = scenario({"mamba_block_size": 64, "attn_block_size": 64, "max_num_batched_tokens": 128,
                   "num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 16},
                  [{"unique_len": 197}, {"arrival_step": 12, "unique_len": 20, "continues": 0, "continue_outputs": 0}])


def kinds(s, mutant: str | None = None) -> list[str]:
    with patching.applied(planting.patches(mutant) if mutant else []):
        verdict = evaluate(s, "fixed", efficiency=False).verdict
    return [f.signature for f in verdict.findings]


@pytest.mark.parametrize("prompt_len", [1, 15, 16, 17, 63, 64, 65, 200])
@pytest.mark.parametrize("alignment", [1, 8, 16])
@pytest.mark.parametrize("eagle", [False, True])
def test_prompt_checkpoint_is_vllms(prompt_len, alignment, eagle):
    assert resources.prompt_checkpoint(prompt_len, alignment, eagle) == \
        get_mamba_prefill_checkpoint_position(prompt_len, alignment, eagle)


def test_a_resend_is_clean_on_vllm_and_a_missed_hit_with_the_prompt_checkpoint_evicted():
    assert kinds(RESEND) == []
    found = kinds(RESEND, "resource_prompt_checkpoint_evicted")
    assert found and found[0] == "missed_hit:below-prompt-checkpoint", found


@pytest.mark.parametrize("engine, request_spec, mutant, signature", [
    ({"max_num_batched_tokens": 32}, {"unique_len": 200, "max_tokens": 4},
     "resource_state_freed_late", "capacity:held-over-reserve/mamba"),
    ({"max_num_batched_tokens": 64}, {"unique_len": 90, "max_tokens": 3},
     "resource_free_count_inflated", "pool_accounting:free-count"),
], ids=["state-block-freed-late", "free-count-inflated"])
def test_a_planted_resource_bug_is_found_where_vllm_is_clean(engine, request_spec, mutant, signature):
    s = scenario({"mamba_block_size": 32, "attn_block_size": 32, **engine}, [request_spec])
    assert kinds(s) == []
    found = kinds(s, mutant)
    assert found and found[0] == signature, found


def _trace(served: int, evicted_at: int | None = None) -> Trace:
    """r0 (40 tokens) prefills at step 0; r1, whose prompt starts with r0's, is admitted at step 2."""
    t = Trace(split="fixed", prefix_caching=True, step_bound=20, hit_alignment=8,
              group_kinds=("FullAttentionSpec", "mamba"), group_block_sizes=(8, 16), lru_evictions={})
    t.prompts = {"r0": tuple(range(40)), "r1": tuple(range(40)) + (99, 98)}
    t.prompt_lens = {"r0": 40, "r1": 42}
    first = Chunk("r0", 0, 40, 0, 0, 1, None, None, True, False)
    t.steps = [StepRecord(0, admissions=[Admission("r0", 0, 0, False)], chunks=[first]), StepRecord(1),
               StepRecord(2, admissions=[Admission("r1", served, 0, False)])]
    if evicted_at is not None:
        t.lru_evictions[evicted_at] = 1
    return t


def test_missed_hit_rule_on_a_built_trace():
    assert resources.check_missed_hits(_trace(32)) is None  # checkpoint (40 - 1) // 8 * 8 = 32
    found = resources.check_missed_hits(_trace(24))
    assert found is not None and found.mechanism == "short-hit" and "checkpoint at 32" in found.message
    assert resources.check_missed_hits(_trace(0, evicted_at=1)) is None  # an eviction can take the hit away
    t = _trace(0)
    t.group_block_sizes = (64, 16)  # attention's full blocks stop short of the checkpoint: no bound
    assert resources.check_missed_hits(t) is None
    t = _trace(0)  # r0's first 36 tokens came from the connector: its checkpoint at 32 was never computed
    t.steps[0].admissions = [Admission("r0", 0, 36, True)]
    assert resources.check_missed_hits(t) is None


def test_lru_evictions_are_counted_as_the_pool_makes_them(monkeypatch):
    """The bridge counts the cached blocks `get_new_blocks` hands out (it evicts each) before the
    pool evicts them: the same count as the evictions vLLM's `_maybe_evict_cached_block` reports,
    and none on a pool large enough to evict nothing."""
    from vllm.v1.core.block_pool import BlockPool

    from mambafuzz.sim.engine import harness

    reported = []
    real = BlockPool._maybe_evict_cached_block

    def spy(self, block):
        evicted = real(self, block)
        reported.append(evicted)
        return evicted

    monkeypatch.setattr(BlockPool, "_maybe_evict_cached_block", spy)
    requests = [{"arrival_step": 10 * i, "unique_len": 150, "max_tokens": 2} for i in range(3)]
    engine = {"mamba_block_size": 32, "attn_block_size": 32, "max_num_batched_tokens": 64}
    assert harness.run(scenario(engine, requests)).lru_evictions == {}
    reported.clear()
    counted = harness.run(scenario({**engine, "num_gpu_blocks": 20}, requests)).lru_evictions
    assert counted and sum(counted.values()) == sum(reported) > 0


def test_a_count_fault_on_a_step_that_keeps_the_free_count_is_seen_by_the_next_walk(monkeypatch):
    """The pool is walked after each step that moved its free count and every 8th step
    (pool_facts.PoolFacts). A negative count planted on a free block during a decode, which moves no
    block in or out of the free queue, is reported from the next walk, at most 7 steps later."""
    from mambafuzz.sim.bridge import scheduler_session

    s = scenario({"mamba_block_size": 32, "attn_block_size": 32, "max_num_batched_tokens": 64,
                  "num_gpu_blocks": 64}, [{"unique_len": 40, "max_tokens": 24}])
    clean = evaluate(s, "fixed", efficiency=False)
    assert clean.verdict.clean and len(clean.trace.pool) < len(clean.trace.steps)  # some steps are not walked
    planted_at = 10
    assert planted_at % 8 and planted_at not in {p[0] for p in clean.trace.pool}
    real = scheduler_session.SchedulerSession.feed
    fed = []

    def feed(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        fed.append(None)
        if len(fed) == planted_at:  # the update of step 10, a decode inside a block
            self.block_pool.blocks[-1].ref_cnt = -1  # free, at the free queue's end: never handed out here
        return out

    monkeypatch.setattr(scheduler_session.SchedulerSession, "feed", feed)
    verdict = evaluate(s, "fixed", efficiency=False, differential=False).verdict
    finding = next(f for f in verdict.findings if f.kind == "pool_accounting")
    assert finding.location == "negative-ref-count" and planted_at <= finding.step <= planted_at + 7, finding


def test_a_leaked_reference_is_found_when_it_leaks_not_at_the_end():
    """Every block's reference count is the number of request tables and deferred frees holding it
    (`pool_accounting:ref-conservation`). A hit that takes one reference too many leaves the pool's
    counts consistent (the block is simply not free); before this rule only the end of a run that
    finished saw it (`leaked-at-end`), now the walk after the hit names the block."""

    assert kinds(RESEND) == []
    with patching.applied(planting.patches("resource_hit_reference_leaked")):
        verdict = evaluate(RESEND, "fixed", efficiency=False)
    finding = verdict.verdict.findings[0]
    assert finding.signature == "pool_accounting:ref-conservation/unowned-reference", finding
    admitted = next(rec.step for rec in verdict.trace.steps for a in rec.admissions if a.request_id == "r1")
    assert admitted <= finding.step < len(verdict.trace.steps) - 1  # mid-run, within a walk of the hit
    assert "reference count of 2, but 1 request table entry and 0 deferred free(s)" in finding.message


def test_the_pool_walk_counts_holders_in_tables_and_deferred_frees():
    """The bridge's one walk of the pool: its counts (the null block, id 0, left out) and the first
    block whose reference count is not its table entries plus its deferred frees."""
    from types import SimpleNamespace

    from mambafuzz.sim.bridge import scheduler_session

    blocks = [SimpleNamespace(block_id=i, ref_cnt=r) for i, r in enumerate([7, 1, 2, 0])]  # block 0: the null block
    pool = SimpleNamespace(blocks=blocks, get_num_free_blocks=lambda: 1)
    session = SimpleNamespace(block_pool=pool, null_block_id=0,
                              _managers=[SimpleNamespace(req_to_blocks={"a": [blocks[1], blocks[2]]})],
                              scheduler=SimpleNamespace(deferred_frees=[(3, [blocks[2]])]))
    assert scheduler_session.SchedulerSession.walk_pool(session) == ((1, 1, 0), None)
    blocks[3].ref_cnt = 1
    assert scheduler_session.SchedulerSession.walk_pool(session) == ((1, 0, 0), (3, 1, 0, 0))
    blocks[3].ref_cnt, blocks[2].ref_cnt = -1, 1
    assert scheduler_session.SchedulerSession.walk_pool(session) == ((1, 0, 1), (2, 1, 1, 1))
    # the null block's own count, negative (free_blocks decrements it) or 0, changes no figure
    for null_count in (-3, 0):
        blocks[0].ref_cnt = null_count
        assert scheduler_session.SchedulerSession.walk_pool(session) == ((1, 0, 1), (2, 1, 1, 1))
    blocks[3].ref_cnt = 0
    assert scheduler_session.SchedulerSession.walk_pool(session) == ((1, 1, 0), (2, 1, 1, 1))


def test_an_allocation_past_its_estimate_is_found():
    """`allocate_slots` takes no more blocks than its estimate said were needed (the estimate is its
    only capacity check); the planted MambaManager estimate one block short is found on an ample
    pool, where vLLM itself never notices (it only crashes on a pool with exactly the estimate free)."""
    s = scenario({"mamba_block_size": 32, "attn_block_size": 32, "max_num_batched_tokens": 64},
                 [{"unique_len": 90, "max_tokens": 3}])
    assert kinds(s) == []
    assert kinds(s, "admission_estimate_one_short")[:1] == ["capacity:allocation-over-estimate"]


def test_sync_connector_tokens_take_a_block_per_mamba_group_past_the_estimate():
    """On unmodified vLLM 0.32.0 the rule fires where upstream finding 4 lives (sync connector tokens:
    the estimate caps what `allocate_external_computed_blocks` then takes, one block per mamba group),
    and that finding's candidate fix makes it clean."""
    from pathlib import Path

    from mambafuzz.store import corpus

    root = Path(__file__).resolve().parents[2] / "corpus"
    s = corpus.load_case(root / "seeds" / "connector_sync_aligned_and_unaligned.json").scenario
    ev = evaluate(s, "fixed", efficiency=False)
    assert [f.signature for f in ev.verdict.findings] == ["capacity:allocation-over-estimate"]
    _, _, estimated, taken = ev.trace.over_estimates[0]
    assert taken - estimated == 3  # the tiny model's three mamba groups
    fix = patching.load_patches(str(root / "upstream/connector_admission_estimate_short_per_mamba_group/fix.py"))
    with patching.applied(fix):
        assert evaluate(s, "fixed", efficiency=False).verdict.clean


def test_a_freed_requests_state_left_in_the_manager_is_found_at_the_end():
    """Once every request is done no manager keeps per-request state of a freed one
    (`pool_accounting:request-state-at-end`; vLLM's tests/v1/core/test_deferred_block_free.py asserts
    it of `req_to_blocks` after a free). The planted leak (align mode keeps a freed request's
    `last_state_block_idx`) changes no block, no count and no state: before the rule the run was clean."""
    s = scenario({"mamba_block_size": 32, "attn_block_size": 32, "max_num_batched_tokens": 64},
                 [{"unique_len": 90, "max_tokens": 40}])
    assert kinds(s) == []
    with patching.applied(planting.patches("resource_request_state_kept")):
        verdict = evaluate(s, "fixed", efficiency=False).verdict
    assert [f.fine_signature for f in verdict.findings] == \
        ["pool_accounting:request-state-at-end|MambaManager.last_state_block_idx"], verdict.findings
    assert "r0 still has an entry in MambaManager.last_state_block_idx" in verdict.findings[0].message


def test_the_request_state_read_is_by_shape():
    """`SchedulerSession.request_state_left` reads every dict, set and list of tuples of the KV-cache
    manager, its coordinator and its single-type managers for the session's request ids, and the
    scheduler's `requests`, whatever the container is called."""
    from types import SimpleNamespace

    from mambafuzz.sim.bridge import scheduler_session

    class MambaManager(SimpleNamespace):
        pass

    class Coordinator(SimpleNamespace):
        pass

    class KVCacheManager(SimpleNamespace):
        pass

    mamba = MambaManager(req_to_blocks={"a": []}, _new_dict={"b": 1, 7: 2}, _offers=[("a", 1), ("zz", 2)],
                         _empty={}, block_size=16, name="b")
    manager = KVCacheManager(coordinator=Coordinator(pending={"c"}), stats={"x": 1})
    session = SimpleNamespace(_requests={"a": 0, "b": 0, "c": 0, "d": 0}, _managers=(mamba,),
                              scheduler=SimpleNamespace(kv_cache_manager=manager, requests={"d": 0}))
    assert scheduler_session.SchedulerSession.request_state_left(session) == [
        ("Coordinator.pending", "c"), ("MambaManager._new_dict", "b"), ("MambaManager._offers", "a"),
        ("MambaManager.req_to_blocks", "a"), ("Scheduler.requests", "d")]
    mamba._empty["a"] = 1  # a container empty at the first read is read again at the next
    assert ("MambaManager._empty", "a") in scheduler_session.SchedulerSession.request_state_left(session)
