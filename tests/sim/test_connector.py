"""The scenario's KV connector beyond one-step true loads: saving on request_finished with
delayed frees (finished_sending), loads of what was saved, multi-step and failing async loads,
and divergent local hybrid hits (EngineConfig.connector_* knobs)."""

import dataclasses

import pytest

from mambafuzz.checks.oracle import judge
from mambafuzz.checks.pipeline import evaluate
from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario, ScenarioError, from_json
from mambafuzz.sim import harness


def saving_scenario(**engine) -> Scenario:
    """r0 computes a 150-token shared prefix in 64-token chunks and saves its mamba blocks; r1
    arrives after r0 finished and claims up to 149 tokens from the connector. vLLM's default
    retention keeps no local mamba state below 150 tokens, so only the connector can serve r1."""
    knobs = dict(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=64, max_num_seqs=4,
                 async_scheduling=False, connector_save=True, connector_load_source="saved")
    knobs.update(engine)
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


def test_saves_hold_what_the_kernel_model_wrote_at_each_crossed_boundary():
    trace = harness.run(saving_scenario())
    saves = [e[3] for e in events(trace, "save") if e[2] == "r0"]
    # 64-token chunks end on every boundary of the 300-token prompt: 64, 128, 192, 256
    assert [d.split(" as the state after ")[1].split(" ")[0] for d in saves] == ["64", "128", "192", "256"]
    for detail in saves:
        tokens = detail.split(" as the state after ")[1].split(" ")[0]
        assert f"holds state@{tokens}#" in detail


def test_a_load_delivers_the_saved_state_of_the_longest_saved_boundary():
    trace = harness.run(saving_scenario())
    adm = next(a for rec in trace.steps for a in rec.admissions if a.request_id == "r1")
    assert (adm.local_hit_tokens, adm.external_tokens) == (0, 128)  # saves at 64 and 128 lie within 149
    chunk = first_chunk(trace, "r1")
    assert chunk.start == 128 and chunk.read_state == chunk.true_state
    assert evaluate(saving_scenario(), "fixed").verdict.clean


def test_without_a_save_a_saved_load_source_finds_no_hit():
    trace = harness.run(saving_scenario(connector_save=False))
    adm = next(a for rec in trace.steps for a in rec.admissions if a.request_id == "r1")
    assert adm.external_tokens == 0 and trace.connector_events == []


def test_a_poisoned_save_travels_to_a_later_request_and_is_caught_there():
    s = dataclasses.replace(saving_scenario(), engine=dataclasses.replace(saving_scenario().engine,
                                                                          max_num_batched_tokens=100))
    trace = harness.run(s, unaligned_split, "unaligned")
    poisoned = [e for e in events(trace, "save") if e[2] == "r0" and "after 128 tokens: holds state@100#" in e[3]]
    assert poisoned, trace.connector_events
    chunk = first_chunk(trace, "r1")
    assert chunk.start == 128 and chunk.read_state.num_tokens == 100 and chunk.true_state.num_tokens == 128
    uncached = harness.run(s, unaligned_split, "unaligned", prefix_caching=False)
    verdict = judge(trace, uncached)
    assert any(f.request_id == "r1" for f in verdict.findings), [f.signature for f in verdict.findings]
    # the same planted bug with a connector that loads the truth: r1 resumes correctly
    truth = dataclasses.replace(s, engine=dataclasses.replace(s.engine, connector_load_source="truth"))
    chunk = first_chunk(harness.run(truth, unaligned_split, "unaligned"), "r1")
    assert chunk.read_state == chunk.true_state


def test_a_bad_load_source_is_one_line():
    raw = saving_scenario().to_json()
    raw["engine"]["connector_load_source"] = "disk"
    with pytest.raises(ScenarioError) as err:
        from_json(raw)
    assert err.value.problems == ["engine.connector_load_source must be one of truth, saved, got 'disk'"]
