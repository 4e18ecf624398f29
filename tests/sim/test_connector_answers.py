"""The scenario connector's answers beyond a count of tokens: a lookup deferred with None ("ask again
next step", `RequestSpec.connector_defer`) and a synchronous load that fails
(`EngineConfig.connector_failed_sync_load`). Each reaches vLLM 0.32 through its own connector API;
the rule a deferral must keep (`deferred-request-skipped`) fires on each planted bug that breaks it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mambafuzz.checks.pipeline import evaluate
from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario, ScenarioError, loads, validate
from mambafuzz.sim import patching
from mambafuzz.sim.engine import harness, worker_contract
from mambafuzz.tools.mutation import kills, planted, planting
from tests.helpers.known import unexplained

DEFERRALS = 3


def deferring_scenario(defer: int = DEFERRALS, external_tokens: int = 128, **engine) -> Scenario:
    """r0 claims 128 connector tokens, loaded asynchronously, and its lookup is deferred `defer`
    times; r1, behind it in the waiting queue, claims none."""
    knobs = dict(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=256, max_num_seqs=4,
                 async_scheduling=False)
    knobs.update(engine)
    return Scenario(engine=EngineConfig(**knobs), token_seed=1,
                    requests=[RequestSpec(unique_len=200, max_tokens=3, external_tokens=external_tokens,
                                          external_async=bool(external_tokens), connector_defer=defer),
                              RequestSpec(unique_len=100, max_tokens=3)])


def events(trace, kind):
    return [e for e in trace.connector_events if e[1] == kind]


def admissions(trace, rid):
    return [(rec.step, a) for rec in trace.steps for a in rec.admissions if a.request_id == rid]


@pytest.mark.parametrize("scheduling", [False, True])
def test_a_deferred_request_is_skipped_then_scheduled_with_its_hit(scheduling):
    s = deferring_scenario(async_scheduling=scheduling)
    trace = harness.run(s)
    assert [(e[0], e[2]) for e in events(trace, "defer")] == [(0, "r0"), (1, "r0"), (2, "r0")]
    assert admissions(trace, "r1")[0][0] == 0  # the request behind it is admitted in the first schedule()
    ((step, adm),) = admissions(trace, "r0")
    assert step == DEFERRALS and adm.external_tokens == 128 and adm.external_async
    assert trace.crash is None and not trace.unfinished
    assert unexplained(s, "fixed") is None


def test_without_deferral_the_request_is_admitted_at_once():
    trace = harness.run(deferring_scenario(defer=0))
    assert events(trace, "defer") == [] and admissions(trace, "r0")[0][0] == 0


def test_a_deferring_connector_is_attached_without_claimed_tokens():
    s = deferring_scenario(external_tokens=0)
    assert s.uses_connector
    trace = harness.run(s)
    assert len(events(trace, "defer")) == DEFERRALS and admissions(trace, "r0")[0][0] == DEFERRALS
    assert unexplained(s, "fixed") is None


def test_the_liveness_bound_counts_the_deferrals():
    assert deferring_scenario().liveness_bound() == deferring_scenario(defer=0).liveness_bound() + DEFERRALS


@pytest.mark.parametrize("mutant, broken", [
    ("defer_taken_as_miss", "is scheduled"),  # in the schedule() that deferred it
    ("defer_not_skipped", "was asked again"),  # in that schedule()
])
def test_the_deferred_request_skipped_rule_fires_on_planted_bugs(mutant, broken):
    with patching.applied(planting.patches(mutant)):
        trace = harness.run(deferring_scenario())
    assert trace.crash is not None and trace.crash.contract == worker_contract.DEFERRED_REQUEST_SKIPPED, trace.crash
    assert broken in trace.crash.message, trace.crash.message
    ok, why = kills.confirms_kill(deferring_scenario(), "fixed", mutant)
    assert ok, why


def test_a_deferred_request_lost_from_the_queue_stalls():
    ok, why = kills.confirms_kill(deferring_scenario(), "fixed", "defer_not_requeued", signature="stall:step-bound")
    assert ok, why


def test_a_deferred_request_holding_blocks_breaks_the_rule(monkeypatch):
    """The rule's other half, planted in the harness's view: the session reports blocks held by the
    request the connector deferred."""
    from mambafuzz.sim.bridge import scheduler_session

    monkeypatch.setattr(scheduler_session.SchedulerSession, "holds_blocks", lambda self, rid: rid == "r0")
    trace = harness.run(deferring_scenario())
    assert trace.crash is not None and trace.crash.contract == worker_contract.DEFERRED_REQUEST_SKIPPED
    assert "holds blocks" in trace.crash.message


# ---- a failed synchronous load ---------------------------------------------------------------
def sync_failure_scenario(**engine) -> Scenario:
    """r0 claims 128 connector tokens loaded synchronously, a multiple of the attention block and
    the budget, so its admission estimate is exact; the load fails when the knob says."""
    knobs = dict(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=256, max_num_seqs=4,
                 async_scheduling=False)
    knobs.update(engine)
    return Scenario(engine=EngineConfig(**knobs), token_seed=1,
                    requests=[RequestSpec(unique_len=200, max_tokens=3, external_tokens=128)])


def test_a_failed_sync_load_writes_nothing_and_vllm_runs_the_request_on_it():
    """vLLM 0.32 acts on `failed_recving` only for a request in WAITING_FOR_REMOTE_KVS
    (Scheduler._handle_failed_recving, scheduler.py:3341-3354); a synchronously loaded request is
    running, so it computes from the blocks the load never wrote, and the resume oracle judges it."""
    s = sync_failure_scenario(connector_failed_sync_load=1)
    reported: list[set[str]] = []

    def record(original):
        def handle(self, failed_req_ids):
            reported.append(set(failed_req_ids))
            return original(self, failed_req_ids)
        return handle
    with patching.applied([patching.Wrap(f"{planted.SCHED}._handle_failed_recving", record)]):
        trace = harness.run(s)
    assert reported == [{"r0"}]  # the report reaches vLLM, in the output of the batch that loaded
    assert [(e[0], e[2]) for e in events(trace, "load-fail")] == [(0, "r0")]
    assert not any(w.cause == "connector" for rec in trace.steps for w in rec.writes)
    assert trace.finish_status["r0"] == "FINISHED_LENGTH_CAPPED"  # neither failed nor recomputed
    signatures = [f.signature for f in evaluate(s, "fixed", efficiency=False).verdict.findings]
    assert "resume_state:zeroed" in signatures
    assert unexplained(sync_failure_scenario(connector_failed_sync_load=2), "fixed") is None  # no second load


# ---- the input model ------------------------------------------------------------------------
def test_the_json_round_trip_keeps_the_knobs_and_leaves_them_out_at_their_defaults():
    s = dataclasses.replace(deferring_scenario(), engine=dataclasses.replace(deferring_scenario().engine,
                                                                               connector_failed_sync_load=2))
    raw = json.loads(s.dumps())
    assert raw["requests"][0]["connector_defer"] == DEFERRALS and "connector_defer" not in raw["requests"][1]
    assert raw["engine"]["connector_failed_sync_load"] == 2 and "connector_failure_report" not in raw["engine"]
    assert loads(s.dumps()) == s
    plain = json.loads(deferring_scenario(defer=0).dumps())
    assert "connector_defer" not in plain["requests"][0] and "connector_failed_sync_load" not in plain["engine"]


@pytest.mark.parametrize("change, message", [
    (lambda s: setattr(s.requests[0], "connector_defer", 9), "requests[0].connector_defer must be in [0, 8], got 9"),
    (lambda s: setattr(s.requests[0], "connector_defer", -1), "requests[0].connector_defer must be in [0, 8], got -1"),
    (lambda s: setattr(s.requests[0], "connector_defer", "2"), "requests[0].connector_defer must be an integer"),
    (lambda s: setattr(s.engine, "connector_failed_sync_load", 17), "engine.connector_failed_sync_load must be in [0, 16]"),
    (lambda s: setattr(s.engine, "connector_failure_report", "by_block"), "engine.connector_failure_report must be one of"),
])
def test_the_validator_refuses_bad_values_in_one_line(change, message):
    s = deferring_scenario()
    change(s)
    problems = validate(s)
    assert len(problems) == 1 and problems[0].startswith(message), problems


def test_the_validator_refuses_block_level_failure_reports_on_hybrid_layouts():
    s = sync_failure_scenario(connector_failed_sync_load=1, connector_failure_report="invalid_block_ids")
    (problem,) = validate(s)
    assert "scheduler.py:3366" in problem and "several KV-cache groups" in problem
    with pytest.raises(ScenarioError):
        loads(s.dumps())


def test_both_export_styles_refuse_the_connectors_answers_in_one_line():
    from pathlib import Path

    from mambafuzz.store.corpus import load_case
    from mambafuzz.upstream import export

    path = Path(__file__).resolve().parents[2] / "corpus" / "untriaged" / "connector_failed_sync_load_runs_on_unwritten_state.json"
    case = load_case(path)
    for style, source in (("standalone", export.test_source), ("vllm", export.vllm_test_source)):
        with pytest.raises(export.ExportError) as exc:
            source(case)
        message = str(exc.value)
        assert f"--style {style} cannot express" in message and "connector_failed_sync_load" in message
        assert "\n" not in message
