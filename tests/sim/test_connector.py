"""The scenario's KV connector beyond one-step true loads: saving on request_finished with
delayed frees (finished_sending), loads of what was saved, multi-step and failing async loads,
and divergent local hybrid hits (EngineConfig.connector_* knobs)."""

import dataclasses

import pytest

from mambafuzz.checks.oracle import judge
from mambafuzz.checks.pipeline import evaluate
from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario, ScenarioError, from_json
from mambafuzz.sim.engine import harness, worker_contract
from mambafuzz.sim.engine.connector import ConnectorWorker
from tests.helpers.known import unexplained

# The engine both saving scenarios run on: 64-token blocks and budget, synchronous, a connector
# that saves and loads what it saved.
SAVING = dict(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=64, max_num_seqs=4,
              async_scheduling=False, connector_save=True, connector_load_source="saved")


def saving_scenario(**engine) -> Scenario:
    """r0 computes a 150-token shared prefix in 64-token chunks and saves its mamba blocks; r1
    arrives after r0 finished and claims up to 149 tokens from the connector. vLLM's default
    retention keeps no local mamba state below 150 tokens, so only the connector can serve r1."""
    knobs = {**SAVING, **engine}
    return Scenario(engine=EngineConfig(**knobs), prefixes=[150], token_seed=1,
                    requests=[RequestSpec(prefix_ids=[0], unique_len=150, max_tokens=2),
                              RequestSpec(arrival_step=14, prefix_ids=[0], unique_len=100, max_tokens=2,
                                          external_tokens=149)])


def events(trace, kind):
    return [e for e in trace.connector_events if e[1] == kind]


def first_chunk(trace, rid):
    return next(c for rec in trace.steps for c in rec.chunks if c.request_id == rid)


def unaligned_split(self, request, num_new_tokens, *args, **kwargs):
    """A planted bug: chunks end wherever the budget does, so a block crossed by a later chunk
    keeps a mid-block state and vLLM publishes (and the connector saves) it as the boundary's."""
    return num_new_tokens


def test_the_default_connector_neither_saves_nor_records_events():
    s = saving_scenario(connector_save=False, connector_load_source="truth")
    trace = harness.run(s)
    assert trace.connector_events == []
    assert first_chunk(trace, "r1").start == 149  # a true load of the claimed tokens, in one step


def test_a_saving_connector_keeps_the_blocks_until_finished_sending():
    for steps in (0, 3):
        trace = harness.run(saving_scenario(connector_send_steps=steps))
        (freed,) = [e[0] for e in events(trace, "delay-free") if e[2] == "r0"]
        (sent,) = [e[0] for e in events(trace, "sent") if e[2] == "r0"]
        assert sent - freed == steps + 1  # one update_from_output per step, synchronous
        assert "r0" in trace.finish_status and not trace.unfinished


def offload_scenario(**engine) -> Scenario:
    """r0's 300-token prompt (a 260-token shared prefix) is saved through the scheduler's
    boundary-state hand-offs: vLLM's default retention keeps, and so hands off, its last prompt
    boundary, 256. Three 500-token requests then fill the 36-block pool and evict r0's local
    entries, so r4 (the shared prefix plus 60 tokens, claiming 319 from the connector) has no local
    hit and only the connector's saved state at 256 can serve it."""
    knobs = {**SAVING, "num_gpu_blocks": 36, **engine}
    return Scenario(engine=EngineConfig(**knobs), prefixes=[260], token_seed=1,
                    requests=[RequestSpec(prefix_ids=[0], unique_len=40, max_tokens=2),
                              *[RequestSpec(arrival_step=8, unique_len=500, max_tokens=2) for _ in range(3)],
                              RequestSpec(arrival_step=35, prefix_ids=[0], unique_len=60, max_tokens=2,
                                          external_tokens=319)])


def saved(trace, rid):
    """(step, block, tokens, state text) of each save of `rid`."""
    out = []
    for step, _, _, detail in (e for e in events(trace, "save") if e[2] == rid):
        block, rest = detail.removeprefix("block ").split(" as the state after ")
        tokens, state = rest.split(" tokens: holds ")
        out.append((step, int(block), int(tokens), state))
    return out


def held_when_copied(trace, block, step):
    """What the trace's writes left in `block` by the end of `step` (the copy follows the forward)."""
    held = None
    for rec in trace.steps[:step + 1]:
        for w in rec.writes:
            if w.block_id == block:
                held = w.state
    return held


def connector_write(trace, rid):
    (write,) = [w for rec in trace.steps for w in rec.writes if w.request_id == rid and w.cause == "connector"]
    return write


def test_saves_are_the_scheduler_hand_offs_and_hold_what_the_block_held_after_the_forward():
    trace = harness.run(offload_scenario())
    # r0's 64-token chunks cross 64, 128, 192 and 256, but the scheduler hands off only the
    # boundaries it keeps (the default retention: the prompt's last, 256); the positional save of
    # an earlier model saved all four
    ((step, block, tokens, state),) = saved(trace, "r0")
    assert tokens == 256 and state.startswith("state@256#")
    assert str(held_when_copied(trace, block, step)) == state


def test_a_load_delivers_exactly_what_the_hand_off_block_held_when_copied():
    trace = harness.run(offload_scenario())
    adm = next(a for rec in trace.steps for a in rec.admissions if a.request_id == "r4")
    assert (adm.local_hit_tokens, adm.external_tokens) == (0, 256)  # the fillers evicted r0's local entries
    ((step, block, _, state),) = saved(trace, "r0")
    write = connector_write(trace, "r4")
    assert str(write.state) == state == str(held_when_copied(trace, block, step))
    chunk = first_chunk(trace, "r4")
    assert chunk.start == 256 and chunk.read_state == chunk.true_state
    # clean apart from upstream finding 4's estimate (the sync load takes a block per mamba group past it)
    assert unexplained(offload_scenario(), "fixed") is None


def test_without_a_save_a_saved_load_source_finds_no_hit():
    trace = harness.run(offload_scenario(connector_save=False))
    adm = next(a for rec in trace.steps for a in rec.admissions if a.request_id == "r4")
    assert adm.external_tokens == 0 and trace.connector_events == []


def test_a_poisoned_save_travels_to_a_later_request_and_is_caught_there():
    """The planted split lets r0's chunks end at 100, 200, 300: the block vLLM hashes as the state
    after 256 tokens still holds the state after 200 when the scheduler hands it off, the
    connector copies it, and r4 loads it."""
    s = offload_scenario(max_num_batched_tokens=100)
    trace = harness.run(s, unaligned_split, "unaligned")
    ((step, block, tokens, state),) = saved(trace, "r0")
    assert tokens == 256 and state.startswith("state@200#")
    assert str(connector_write(trace, "r4").state) == state == str(held_when_copied(trace, block, step))
    chunk = first_chunk(trace, "r4")
    assert chunk.start == 256 and chunk.read_state.num_tokens == 200 and chunk.true_state.num_tokens == 256
    uncached = harness.run(s, unaligned_split, "unaligned", prefix_caching=False)
    verdict = judge(trace, uncached)
    caught = {f.signature for f in verdict.findings if f.request_id == "r4"}
    assert any(sig.startswith("slot_hash") or sig.startswith("resume_state") for sig in caught), caught
    assert any(sig.startswith("output_divergence") for sig in caught), caught
    # the same planted bug with a connector that loads the truth: r4 resumes correctly
    chunk = first_chunk(harness.run(offload_scenario(max_num_batched_tokens=100, connector_load_source="truth"),
                                    unaligned_split, "unaligned"), "r4")
    assert chunk.read_state == chunk.true_state


def test_a_vllm_without_hand_offs_saves_nothing_and_says_so(monkeypatch):
    from mambafuzz.sim.bridge import scheduler_session

    monkeypatch.setattr(scheduler_session, "BOUNDARY_STATE_OFFLOADS", False)
    trace = harness.run(offload_scenario())
    (unsupported,) = events(trace, "save-unsupported")
    assert "kv_connector_block_state" in unsupported[3] and events(trace, "save") == []
    adm = next(a for rec in trace.steps for a in rec.admissions if a.request_id == "r4")
    assert adm.external_tokens == 0 and trace.crash is None and not trace.unfinished


def test_a_hand_off_off_the_hash_grid_breaks_the_scheduler_contract(monkeypatch):
    """A store connector keys a hand-off by the prefix hash ending at its boundary (Mooncake
    asserts the boundary is on the hash grid): one that is not is a SchedulerContract finding
    at the scheduler's output, not an entry silently dropped."""
    from mambafuzz.sim.bridge import scheduler_session

    real = scheduler_session.boundary_state_offloads
    monkeypatch.setattr(scheduler_session, "boundary_state_offloads",
                        lambda out: [(r, g, b, t - 1) for r, g, b, t in (real(out) or [])])
    trace = harness.run(offload_scenario())
    assert trace.crash is not None and trace.crash.contract == worker_contract.OFFLOAD_ON_HASH_GRID, trace.crash
    assert events(trace, "save") == []


def test_a_bad_load_source_is_one_line():
    raw = saving_scenario().to_json()
    raw["engine"]["connector_load_source"] = "disk"
    with pytest.raises(ScenarioError) as err:
        from_json(raw)
    assert err.value.problems == ["engine.connector_load_source must be one of truth, saved, got 'disk'"]


def async_scenario(**engine) -> Scenario:
    """r1 claims 100 connector tokens, loaded asynchronously while r0 prefills beside it."""
    knobs = dict(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=128, max_num_seqs=4,
                 async_scheduling=False)
    knobs.update(engine)
    return Scenario(engine=EngineConfig(**knobs), prefixes=[150], token_seed=1,
                    requests=[RequestSpec(prefix_ids=[0], unique_len=150, max_tokens=3),
                              RequestSpec(unique_len=200, max_tokens=3, external_tokens=100, external_async=True)])


def admissions(trace, rid):
    return [(rec.step, a) for rec in trace.steps for a in rec.admissions if a.request_id == rid]


@pytest.mark.parametrize("steps", [0, 2])
@pytest.mark.parametrize("scheduling", [False, True])
def test_an_async_load_finishes_after_the_knobs_forwards(steps, scheduling):
    trace = harness.run(async_scenario(connector_recv_steps=steps, async_scheduling=scheduling))
    ((admitted, adm),) = admissions(trace, "r1")
    assert adm.external_async and adm.external_tokens == 100
    (done,) = [rec.step for rec in trace.steps if "r1" in rec.recv_done]
    assert done == admitted + steps  # one forward per engine step
    assert bool(events(trace, "recv-done")) == bool(steps)  # the default run records what it always did
    chunk = first_chunk(trace, "r1")
    assert chunk.start == 100 and chunk.read_state == chunk.true_state
    assert unexplained(async_scenario(connector_recv_steps=steps, async_scheduling=scheduling), "fixed") is None


@pytest.mark.parametrize("scheduling", [False, True])
def test_a_failed_load_is_recomputed_and_judged_like_any_request(scheduling):
    s = async_scenario(connector_recv_steps=1, connector_failed_load=1, connector_failure_policy="recompute",
                       async_scheduling=scheduling)
    trace = harness.run(s)
    assert [e[2] for e in events(trace, "load-fail")] == ["r1"]
    # vLLM resets the request (Scheduler._handle_failed_recving) and asks the connector again: a second load
    assert [a.external_tokens for _, a in admissions(trace, "r1")] == [100, 100]
    assert trace.finish_status["r1"] == "FINISHED_LENGTH_CAPPED"
    ev = evaluate(s, "fixed")
    assert unexplained(s, "fixed") is None and ev.trace.outputs["r1"] == ev.uncached.outputs["r1"]


def test_a_failed_load_under_vllms_default_policy_fails_the_request():
    trace = harness.run(async_scenario(connector_failed_load=1))
    assert trace.finish_status["r1"] == "FINISHED_ERROR" and trace.finish_status["r0"] == "FINISHED_LENGTH_CAPPED"
    assert evaluate(async_scenario(connector_failed_load=1), "fixed").verdict.clean  # an error has no completion


def test_only_the_chosen_load_fails():
    trace = harness.run(async_scenario(connector_failed_load=2, connector_failure_policy="recompute"))
    assert events(trace, "load-fail") == [] and len(admissions(trace, "r1")) == 1


def test_divergent_hybrid_hits_reach_vllm_and_the_connector_restores_the_mamba_state():
    """vLLM 0.32 asks get_computed_blocks_for_connector when the connector declares
    supports_divergent_local_hybrid_hits: the local hit is the attention group's (128 tokens of
    the shared prefix, whose mamba state vLLM's default retention did not keep), and the
    connector's load supplies the mamba state at the resume point."""
    base = saving_scenario(connector_save=False, connector_load_source="truth")
    plain = admissions(harness.run(base), "r1")[0][1]
    assert (plain.local_hit_tokens, plain.external_tokens) == (0, 149)
    s = dataclasses.replace(base, engine=dataclasses.replace(base.engine, connector_divergent_hits=True))
    trace = harness.run(s)
    adm = admissions(trace, "r1")[0][1]
    assert (adm.local_hit_tokens, adm.external_tokens) == (128, 21)
    chunk = first_chunk(trace, "r1")
    assert chunk.start == 149 and chunk.read_state == chunk.true_state
    assert evaluate(s, "fixed").verdict.clean


# Two saving requests (r0, r3) whose sends finish at the same update_from_output: vLLM frees their
# blocks in the order it iterates `finished_sending`, and later allocations take those block ids.
SAME_STEP_SENDS = {
    "format": "mambafuzz-scenario", "version": 2, "token_seed": 1, "prefixes": [], "acceptance": [],
    "engine": {"mamba_block_size": 32, "attn_block_size": 32, "max_num_batched_tokens": 13, "max_num_seqs": 3,
               "async_scheduling": None, "connector_save": True, "connector_send_steps": 3,
               "connector_failure_policy": "recompute", "connector_divergent_hits": True},
    "requests": [{"arrival_step": 5, "unique_len": 13, "max_tokens": 8, "external_tokens": 5},
                 {"arrival_step": 8, "unique_len": 63, "max_tokens": 3},
                 {"arrival_step": 6, "unique_len": 30, "max_tokens": 5},
                 {"arrival_step": 4, "unique_len": 36, "max_tokens": 8}],
}

_DIGEST = """
import json, sys
from mambafuzz.search.startup import prepare_process
prepare_process()
from mambafuzz.checks.pipeline import evaluate
from mambafuzz.model.scenario import from_json
from mambafuzz.store.report import trace_digest
ev = evaluate(from_json(json.loads(sys.argv[1])), "fixed", efficiency=False)
print("digest", trace_digest(ev.trace))
"""


def test_finished_sends_free_blocks_in_the_same_order_under_any_hash_seed():
    """A set of request ids iterates in the order of the process's hash seed; before the bridge
    handed vLLM sorted ids, hash seeds 0 and 1 gave this case different block ids from step 22 on,
    so a finding could fail in the worker and replay clean in `repro`."""
    import json
    import os
    import subprocess
    import sys

    digests = set()
    for seed in ("0", "1"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _DIGEST, json.dumps(SAME_STEP_SENDS)], env=env,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        digests |= {line for line in out.stdout.splitlines() if line.startswith("digest ")}
    assert len(digests) == 1, digests


def test_finished_ids_iterate_sorted():
    from mambafuzz.sim.bridge.scheduler_session import SortedIds

    ids = SortedIds({"r3", "r0", "r10", "r2"})
    assert list(ids) == ["r0", "r10", "r2", "r3"] and "r3" in ids and len(ids) == 4


def test_a_load_of_a_saved_state_carries_no_realism_note():
    """The save follows vLLM's boundary-state hand-offs now, so a wrong saved state is one the
    scheduler named; an earlier positional save carried a note that its findings may be the model's."""
    from mambafuzz.model.scenario import engine_realism_notes

    assert engine_realism_notes(offload_scenario().engine) == []


def test_each_mamba_group_saves_and_loads_its_own_state(monkeypatch):
    """A store keeps every group's layers: a hand-off block that holds a wrong state in the second
    mamba group only reaches r4's second group, where its read is caught; the first group's load
    (the trace's) stays right. Saving the first group's state for every group would hide it."""
    original = ConnectorWorker.save_offloads

    def second_group_poisoned(self, step, out, live, models):
        groups = self.session.mamba_groups
        for rid, group, block, tokens in self.connector.offloads or ():
            if group == groups[1] and rid in live:
                models[1].held[block] = live[rid].truth.at(tokens - 1)
        original(self, step, out, live, models)

    monkeypatch.setattr(ConnectorWorker, "save_offloads", second_group_poisoned)
    trace = harness.run(offload_scenario())
    assert [e for e in events(trace, "save-group") if e[2] == "r0"]  # the second group's differing save is told
    chunk = first_chunk(trace, "r4")
    assert chunk.start == 256 and chunk.read_state == chunk.true_state  # the first group loads its own, right state
    wrong = [(group, c) for _, group, c in trace.mamba_group_reads if c.request_id == "r4" and c.start == 256]
    assert [group for group, _ in wrong] == [1] and wrong[0][1].read_state.num_tokens == 255, trace.mamba_group_reads
