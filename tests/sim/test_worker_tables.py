"""The worker's block tables are built from SchedulerOutput alone (mambafuzz/sim/worker/worker_tables.py),
as vLLM 0.32's workers build theirs, and a row that uses a block the scheduler swapped without
telling is a `row-blocks-as-told` contract finding (worker_contract.check_told_blocks)."""

from types import SimpleNamespace

import pytest

from mambafuzz.checks.pipeline import evaluate
from mambafuzz.model.scenario import from_json
from mambafuzz.sim import patching
from mambafuzz.sim.bridge import scheduler_session
from mambafuzz.sim.engine import worker_contract
from mambafuzz.sim.worker.worker_tables import UntoldRequest, WorkerTables
from mambafuzz.tools.mutation import planting


def output(new=(), cached=(), resumed=(), finished=(), preempted=()):
    """A SchedulerOutput's fields the worker reads: `new` (rid, block_ids), `cached` (rid, new_block_ids)."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r, block_ids=b, num_computed_tokens=0) for r, b in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[r for r, _ in cached], new_block_ids=[b for _, b in cached],
                                              num_computed_tokens=[7] * len(cached), resumed_req_ids=set(resumed)),
        finished_req_ids=set(finished), preempted_req_ids=set(preempted))


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_tables_come_from_the_messages_appended_and_replaced_on_resumption(runner):
    t = WorkerTables((1,), runner)  # group 1 is the mamba group; group 0 (attention) is not kept
    t.update(output(new=[("a", ([1, 2], [0, 5]))]))
    assert t.get("a") == ([0, 5],)
    assert t.computed == {"a": 0}
    t.update(output(cached=[("a", ([3], [6, 7]))]))
    assert t.get("a") == ([0, 5, 6, 7],) and t.computed == {"a": 7}
    t.update(output(cached=[("a", None)]))  # nothing new: the table stays
    assert t.get("a") == ([0, 5, 6, 7],)
    t.update(output(preempted=["a"]))
    assert ("a" in t) is (runner == "v1")  # V2's finish_requests forgets a preempted request; V1 keeps it
    t.update(output(cached=[("a", ([4], [9]))], resumed=["a"]))
    assert t.get("a") == ([9],)
    t.update(output(finished=["a"]))
    assert t.get("a") is None


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_side_groups_follow_the_same_messages_in_the_same_pass(runner):
    t = WorkerTables((1,), runner, side_groups=(0,))  # the attention group, kept aside for attention_kv
    t.update(output(new=[("a", ([1, 2], [0, 5]))]))
    assert t.get("a") == ([0, 5],) and t.get_side("a") == ([1, 2],)
    t.update(output(cached=[("a", ([3], [6]))]))
    assert t.get_side("a") == ([1, 2, 3],)
    t.update(output(preempted=["a"]))
    assert (t.get_side("a") is not None) is (runner == "v1")
    t.update(output(cached=[("a", ([4], [9]))], resumed=["a"]))
    assert t.get_side("a") == ([4],)
    t.update(output(finished=["a"]))
    assert t.get_side("a") is None and WorkerTables((1,), runner).get_side("a") is None


def test_a_running_request_the_worker_never_got_is_an_untold_request():
    t = WorkerTables((0,), "v1")
    with pytest.raises(UntoldRequest):
        t.update(output(cached=[("ghost", ([1],))]))
    with pytest.raises(UntoldRequest):
        t.update(output(cached=[("ghost", None)], resumed=["ghost"]))


def test_an_unknown_runner_is_one_line():
    with pytest.raises(ValueError, match="unknown model runner"):
        WorkerTables((0,), "v9")


def never_scratch(rid, block):
    return False


def _blocks(*ids: int) -> list[SimpleNamespace]:
    """A manager's table as check_told_blocks reads it: vLLM's block objects (only their ids are read)."""
    return [SimpleNamespace(block_id=i) for i in ids]


def test_the_rule_on_tables_a_row_uses():
    told, held = ([0, 4, 5, 6],), (_blocks(0, 4, 0, 7),)
    # a row that reads column 3, where the scheduler holds another real block: swapped without a message
    with pytest.raises(worker_contract.SchedulerContractError) as exc:
        worker_contract.check_told_blocks("r", told, held, 3, [], (), 0, never_scratch)
    assert exc.value.contract == worker_contract.ROW_BLOCKS_AS_TOLD and "block 7" in str(exc.value)
    # column 2 was nulled without a message: reading it is the state oracles' business; writing is a
    # finding unless the block is still the request's own unhashed scratch
    worker_contract.check_told_blocks("r", told, held, 2, [], (), 0, never_scratch)
    worker_contract.check_told_blocks("r", told, held, 1, [(2, 5)], (), 0, lambda rid, b: b == 5)
    with pytest.raises(worker_contract.SchedulerContractError, match="no longer holds"):
        worker_contract.check_told_blocks("r", told, held, 1, [(2, 5)], (), 0, never_scratch)
    # columns no row uses may differ
    worker_contract.check_told_blocks("r", told, held, 1, [(1, 4)], (), 0, never_scratch)
    # past the manager's table there is no block; the first bad column is named, in column order
    with pytest.raises(worker_contract.SchedulerContractError, match="column 3 .*block 7"):
        worker_contract.check_told_blocks("r", told, held, 5, [(3, 6)], (), 0, never_scratch)
    with pytest.raises(worker_contract.SchedulerContractError, match="column 5 .*holds no block"):
        worker_contract.check_told_blocks("r", ([0, 4, 5, 6, 8, 9],), held, 5, [], (), 0, never_scratch)


# Found by the PR job (ci/pr-fuzz 120 against the installed vLLM) with the mutant planted, from
# generated inputs, and minimized by it: one request whose prompt's fine-grained hash boundary
# makes it a producer of a partial block while it runs.
PARTIAL_TAIL = from_json({
    "format": "mambafuzz-scenario", "version": 2,
    "engine": {"mamba_block_size": 8, "attn_block_size": 1, "max_num_batched_tokens": 1, "max_num_seqs": 1,
               "async_scheduling": None},
    "prefixes": [], "requests": [{"arrival_step": 0, "prefix_ids": [], "unique_len": 2, "max_tokens": 1,
                                  "external_tokens": 0, "external_async": False, "abort_step": None}],
    "acceptance": [], "token_seed": 0})


def signatures(s, mutant=None, runner=None):
    with patching.applied(planting.patches(mutant) if mutant else []):
        return [f.signature + "|" + f.mechanism for f in evaluate(s, "fixed", efficiency=False, runner=runner)
                .verdict.findings]


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_a_block_swapped_in_a_running_table_is_found_where_vllm_is_clean(runner):
    assert signatures(PARTIAL_TAIL, runner=runner) == []
    found = signatures(PARTIAL_TAIL, "table_first_allocation_rerun", runner)
    assert found and found[0] == "vllm_crash:SchedulerContract@scheduler-output|row-blocks-as-told", found


# MTP with chunked prefill and prefill checkpoints: vLLM 0.32's manager moves a speculative block to a
# later column and nulls the old one without telling the worker, whose checkpoint (computed for every
# chunk, layers/mamba/checkpoint.py) then lands in that block through its stale column. The block is
# the request's own unhashed scratch, so nothing is harmed: clean, and a finding once that is denied.
RELOCATED = from_json({
    "format": "mambafuzz-scenario", "version": 2,
    "engine": {"mamba_block_size": 96, "attn_block_size": 96, "prefix_match_unit": 8, "max_num_batched_tokens": 192,
               "max_num_seqs": 4, "spec_method": "mtp", "num_speculative_tokens": 2,
               "num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 1, "async_scheduling": False},
    "prefixes": [], "requests": [{"arrival_step": 0, "prefix_ids": [], "unique_len": 570, "max_tokens": 3,
                                  "external_tokens": 0, "external_async": False, "abort_step": None}],
    "acceptance": [], "token_seed": 0})


def test_a_stale_write_into_the_requests_own_relocated_scratch_block_is_not_a_finding(monkeypatch):
    assert signatures(RELOCATED) == []
    monkeypatch.setattr(scheduler_session.SchedulerSession, "own_scratch", lambda self, rid, block: False)
    found = signatures(RELOCATED)
    assert found and found[0].endswith("|row-blocks-as-told"), found
