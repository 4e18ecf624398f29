"""End to end through vLLM's real scheduler: the first-chunk case and a real prefix hit."""

import dataclasses

import pytest

from mambafuzz.checks.pipeline import evaluate
from mambafuzz.sim.engine import harness, splits, worker_contract
from tests.conftest import first_chunk_scenario, shared_prefix_scenario


def test_first_chunk_poisoning_is_caught_on_prefix_and_absent_on_fixed():
    s = first_chunk_scenario()
    fixed = evaluate(s, "fixed")
    assert fixed.verdict.clean, fixed.verdict.primary
    bad = evaluate(s, "prefix")
    f = bad.verdict.primary
    assert f.kind == "slot_hash" and f.request_id == "r1"
    assert "slot 0 of r1" in f.message and "after 1600 tokens" in f.message and "state@768" in f.message


def test_fixed_split_defers_the_fragmented_first_chunk():
    trace = harness.run(first_chunk_scenario(), None, "fixed")
    r1_prefill_ends = [c.end for rec in trace.steps for c in rec.chunks if c.request_id == "r1" and c.end <= 2002]
    # No chunk stops at the budget's edge (768); the only mid-block stop is the prompt-tail
    # checkpoint the partial-hit mode asks for (floor(2001 / 16) * 16 - 16 with MTP's block drop).
    assert r1_prefill_ends == [1984, 2002]


def test_second_request_resumes_from_a_real_prefix_hit():
    trace = harness.run(shared_prefix_scenario(), None, "fixed")
    admissions = {a.request_id: a for rec in trace.steps for a in rec.admissions}
    assert admissions["r1"].local_hit_tokens == 192  # three 64-token mamba blocks of the shared prefix
    first = next(c for rec in trace.steps for c in rec.chunks if c.request_id == "r1")
    assert first.resumed_from_hit and first.read_state == first.true_state


def test_a_poisoned_hit_is_read_back_as_a_resume_mismatch():
    """The second request of the first-chunk case hits the poisoned block under `prefix`."""
    s = first_chunk_scenario()
    s.prefixes = [1700, 301]
    s.requests[1] = dataclasses.replace(s.requests[1], prefix_ids=[0, 1], unique_len=1)
    s.requests.append(dataclasses.replace(s.requests[1], arrival_step=8, prefix_ids=[0], unique_len=30))
    trace = harness.run(s, splits.resolve("prefix"), "prefix")
    resumed = [c for rec in trace.steps for c in rec.chunks if c.request_id == "r2" and c.resumed_from_hit]
    assert resumed and resumed[0].start == 1600 and resumed[0].read_state.num_tokens == 768
    assert evaluate(s, "prefix").verdict.kind == "slot_hash"  # the publication is caught first


def test_differential_runs_with_prefix_caching_off_agree_on_fixed():
    ev = evaluate(shared_prefix_scenario(), "fixed")
    assert ev.uncached is not None and ev.uncached.outputs == ev.trace.outputs
    assert all(len(v) == 3 for v in ev.trace.outputs.values())


def test_connector_tokens_come_through_the_real_connector():
    s = shared_prefix_scenario()
    s.requests[0].external_tokens = 70
    trace = harness.run(s, None, "fixed")
    adm = trace.steps[0].admissions[0]
    assert adm.external_tokens == 70 and adm.local_hit_tokens == 0
    assert trace.steps[0].chunks[0].start == 70 and trace.steps[0].chunks[0].end == 128
    assert any(w.cause == "connector" for w in trace.steps[0].writes)


def test_the_retention_interval_reaches_vllm():
    """The first-chunk poisoning needs vLLM to keep the 1600-token boundary: dense retention
    keeps it; the default sparse retention (0) keeps only the replay boundary, which under MTP is
    below the first block, so the same schedule publishes nothing there."""
    dense = first_chunk_scenario()
    sparse = dataclasses.replace(dense, engine=dataclasses.replace(dense.engine, prefix_cache_retention_interval=0))
    assert evaluate(dense, "prefix").verdict.kind == "slot_hash"
    assert evaluate(sparse, "prefix").verdict.clean


def test_the_cache_audit_rejudges_a_published_block_when_it_is_written_again():
    """The per-step audit skips entries it has already judged unless the kernel model wrote
    their block that step: a block overwritten after publication shows up again, poisoned."""
    from types import SimpleNamespace

    from mambafuzz.sim.engine.cache_audit import BlockAuditor
    from mambafuzz.sim.engine.cache_scan import CacheScan
    from mambafuzz.sim.engine.hash_book import HashBook
    from mambafuzz.sim.state import PrefixStates
    from mambafuzz.sim.trace import StepRecord, Trace
    from mambafuzz.sim.worker.kernel_model import KernelGeometry, KernelModel

    truth = PrefixStates(list(range(1, 20)))
    key = b"h" * 32 + bytes(4)  # a block hash plus the 4-byte group id vLLM appends
    block = SimpleNamespace(block_id=7, block_hash=key, block_hash_num_tokens=8)
    trace = Trace(split="fixed", prefix_caching=True)
    keys_version = [0]  # unchanged after the first step: the audit works from its last scan
    session = SimpleNamespace(cached_mamba_blocks=lambda: iter([(key, block)]),
                              cache_keys_version=lambda: keys_version[0],
                              take_added_mamba_keys=lambda: None)
    book = HashBook(8)
    book.truth[key[:-4]] = ("r0", truth.at(8))
    model = KernelModel(KernelGeometry(block_size=8, hash_block_size=8, checkpoint_alignment=None,
                                       cache_hit_alignment_tokens=8, drop_eagle_block=False,
                                       null_block_id=0, vocab_size=1024))
    scan = CacheScan(session, BlockAuditor(book, model, 8), trace)

    def step(write=None):
        if write is not None:
            model.load_external([7], 8, write)
        rec = StepRecord(0)
        scan.step(rec)
        return [(e.new, e.held) for e in rec.cache]

    assert step(truth.at(8)) == [(True, truth.at(8))]  # published, correct
    assert step() == []  # nothing written: nothing to judge again
    assert step(truth.at(5)) == [(False, truth.at(5))]  # overwritten: judged again, now poisoned
    keys_version[0] += 1  # some mamba key came or went: a full scan, the entry is still known
    assert step() == []
    assert step(truth.at(8)) == [(False, truth.at(8))]
    assert trace.hashed_snapshots == 1


def test_the_cache_audit_between_key_changes_records_what_a_full_scan_every_step_records(monkeypatch):
    """The audit rescans the prefix cache only when a mamba key was added or removed (the
    bridge counts vLLM's inserts and pops); forced to rescan every step, the traces are equal."""
    import random

    from mambafuzz.model.generate import random_scenario
    from mambafuzz.sim.bridge import scheduler_session

    rng = random.Random(11)
    scenarios = [random_scenario(rng) for _ in range(40)]

    def entries():
        return [[[tuple(e) for e in rec.cache] for rec in harness.run(s).steps] for s in scenarios]

    incremental = entries()
    forced = iter(range(10**9))
    monkeypatch.setattr(scheduler_session.SchedulerSession, "cache_keys_version", lambda self: next(forced))
    assert entries() == incremental
    assert sum(len(rec) for runs in incremental for rec in runs) > 0  # the scenarios do publish blocks


def test_the_keys_the_bridge_hands_out_as_added_are_what_a_scan_adds():
    """`take_added_mamba_keys` lets the audit skip a rescan: when it returns pairs, a scan must yield
    the last scan's pairs followed by exactly these. Random inserts (new keys, second blocks on a
    key, other groups' keys) and pops on a real session's key map, checked after every operation."""
    import random

    from mambafuzz.sim.bridge import scheduler_session

    s = shared_prefix_scenario()
    session = scheduler_session.SchedulerSession(s.engine, 64, s.max_model_len(), None)
    session.cache_keys_version()  # the watch, on the empty map of a fresh scheduler
    keys, blocks = session.block_pool.cached_block_hash_to_block, session.block_pool.blocks
    other_suffix = bytes(4) if session._mamba_key_suffix != bytes(4) else (1).to_bytes(4, "little")
    scan: list = []  # what a scan of the empty map yields: the added pairs extend it from the start
    rng = random.Random(5)
    live: list[tuple[bytes, int]] = []
    fast = slow = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.2 and live:
            key, block_id = live.pop(rng.randrange(len(live)))
            keys.pop(key, block_id)
        else:
            suffix = session._mamba_key_suffix if op < 0.85 else other_suffix
            key = bytes([rng.randrange(6)]) * 32 + suffix
            block = blocks[rng.randrange(1, 20)]
            if keys.contain(key, block.block_id):
                continue
            keys.insert(key, block)
            live.append((key, block.block_id))
        added = session.take_added_mamba_keys()
        now = list(session.cached_mamba_blocks())
        if added is not None:
            assert now == scan + added
            fast += 1
        else:
            slow += 1
        scan = now
    assert fast > 50 and slow > 50


def test_a_key_watch_installed_on_a_map_holding_keys_knows_nothing_until_a_full_scan():
    """On an empty map the watch knows the scan (nothing), so the audit's first look extends it;
    on a map that already holds mamba keys the added pairs alone would miss those: a full scan."""
    from mambafuzz.sim.bridge import scheduler_session

    s = shared_prefix_scenario()
    for keyed_before in (False, True):
        session = scheduler_session.SchedulerSession(s.engine, 64, s.max_model_len(), None)
        keys, blocks = session.block_pool.cached_block_hash_to_block, session.block_pool.blocks
        first, second = (bytes([i]) * 32 + session._mamba_key_suffix for i in (1, 2))
        assert session.take_added_mamba_keys() is None  # no watch yet
        if keyed_before:
            keys.insert(first, blocks[1])
        session.cache_keys_version()
        keys.insert(second, blocks[2])
        added = session.take_added_mamba_keys()
        if keyed_before:
            assert added is None and list(session.cached_mamba_blocks()) == [(first, blocks[1]), (second, blocks[2])]
        else:
            assert added == list(session.cached_mamba_blocks()) == [(second, blocks[2])]


def test_every_published_mamba_key_is_in_the_hash_book_when_the_audit_judges_it():
    """The hash book learns each request's new hashes before the audit (and `_after_update` skips
    the requests with none new): an entry whose hash the book does not know would claim no state
    at all and be filed as poisoned."""
    import random

    from mambafuzz.model.generate import random_scenario
    from mambafuzz.model.scenario import ScenarioError, with_scheduling
    from mambafuzz.sim.engine.cache_audit import UNKNOWN_CLAIM

    rng = random.Random(11)
    judged = 0
    for s in [random_scenario(rng) for _ in range(40)]:
        for scheduling in ("sync", "async"):
            try:
                trace = harness.run(with_scheduling(s, scheduling))
            except ScenarioError:  # e.g. pipeline stages, which need async scheduling
                continue
            entries = [e for rec in trace.steps for e in rec.cache]
            assert all(e.claimed_by != UNKNOWN_CLAIM[0] for e in entries)
            judged += len(entries)
    assert judged > 100


def test_a_cache_change_the_counter_misses_is_a_tool_failure_not_a_clean_run(monkeypatch):
    """Should a vLLM change its prefix cache without going through the counted `insert`/`pop`,
    the incremental audit would miss entries; the end-of-run check turns that into a HarnessError."""
    import pytest

    from mambafuzz.sim.bridge import scheduler_session

    monkeypatch.setattr(scheduler_session.SchedulerSession, "cache_keys_version", lambda self: 0)
    with pytest.raises(worker_contract.HarnessError, match="cache_keys_version"):
        harness.run(shared_prefix_scenario())


def test_an_exception_of_the_harness_itself_is_a_tool_error_not_a_vllm_crash(monkeypatch):
    """With no vLLM frame on the stack, our own code raised: that used to be filed as
    `vllm_crash:...@outside-vllm` (the mutation score counted one such "kill")."""
    import pytest

    from mambafuzz.exit_codes import ToolError
    from mambafuzz.sim.engine import harness
    from mambafuzz.sim.worker.kernel_model import KernelModel

    def broken(self, *args, **kwargs):
        raise IndexError("simulated harness bug")

    monkeypatch.setattr(KernelModel, "run_rows", broken)  # the harness's rows go through run_rows
    with pytest.raises(worker_contract.HarnessError, match="the harness itself raised IndexError: simulated harness bug"):
        harness.run(first_chunk_scenario())
    assert issubclass(worker_contract.HarnessError, ToolError)


def test_a_worker_keeps_the_input_counts_a_tool_error_and_goes_on(monkeypatch, tmp_path, capsys):
    """A buggy vLLM must never end a campaign: a tool failure on one input is kept and counted,
    and the worker runs the next input (it used to exit 3 and fuzz nothing more)."""
    from mambafuzz.search import target_runtime
    from mambafuzz.search.worker_protocol import WorkerConfig, parse_event
    from mambafuzz.sim.worker.kernel_model import KernelModel

    rt = target_runtime.Runtime(WorkerConfig(findings=str(tmp_path / "f"), generator="random"))
    with monkeypatch.context() as m:
        m.setattr(KernelModel, "run_rows", lambda self, *a, **k: [][1])
        assert rt.run_scenario(first_chunk_scenario(), {"input": "test"}) is False
    rt.run_scenario(first_chunk_scenario(), {"input": "test"})  # the next input runs
    assert rt.execs == 1 and rt.tool_errors == 1
    rt.status(final=True)
    events = [e for e in map(parse_event, capsys.readouterr().out.splitlines()) if e]
    error = next(e for e in events if e["event"] == "tool_error")
    assert "the harness itself raised IndexError" in error["message"]
    assert not any(e["event"] == "error" for e in events) and events[-1]["tool_errors"] == 1
    kept = list((tmp_path / "f" / "tool-errors").glob("*.json"))
    assert len(kept) == 1 and not list((tmp_path / "f").glob("*.json"))  # kept beside, not filed as a finding


def test_each_rule_of_vllms_row_contract_is_checked_by_name_before_the_harness_uses_the_row():
    """State a buggy vLLM leaves inconsistent is a named contract finding, never an IndexError of
    ours: a negative count, drafts with no token to verify them, a table without the state block."""
    import pytest


    block = 16
    broken = [  # (start, tokens, drafts, request tokens, table, block size), the rule it breaks
        ((-1, 4, 0, 10, [7], block), worker_contract.ROW_WITHIN_TOKENS),
        ((8, 4, 0, 10, [7], block), worker_contract.ROW_WITHIN_TOKENS),
        ((10, 2, 2, 10, [7], block), worker_contract.ROW_VERIFIES_DRAFTS),
        ((16, 4, 0, 40, [7], block), worker_contract.ROW_STATE_IN_TABLE),
        ((0, 1, 0, 1, [], None), worker_contract.ROW_STATE_IN_TABLE),
        ((0, 4.0, 0, 10, [7], block), worker_contract.ROW_COUNTS_ARE_INTEGERS),  # a split that divided with `/`
        ((0.0, 4, 0, 10, [7], block), worker_contract.ROW_COUNTS_ARE_INTEGERS),
    ]
    for args, rule in broken:
        with pytest.raises(worker_contract.SchedulerContractError) as raised:
            worker_contract.check_row("r0", *args)
        assert raised.value.contract == rule, args
        assert raised.value.crash(3).contract == rule
    worker_contract.check_row("r0", 16, 4, 0, 40, [7, 8], block)
    worker_contract.check_row("r0", 16, 4, 0, 40, [7], None)  # prefix caching off: the state lives in column 0
    worker_contract.check_row("r0", 9, 3, 2, 10, [7], block)  # one real token, then two drafts


def _short_tables(monkeypatch, rid: str) -> None:
    """The worker is told `rid`'s mamba block tables without their last block, in every group: a
    vLLM whose SchedulerOutput leaves out (or never allocates) the block the row's state goes to."""
    from mambafuzz.sim.worker.worker_tables import WorkerTables

    get = WorkerTables.get
    monkeypatch.setattr(WorkerTables, "get",
                        lambda self, r: tuple(t[:-1] for t in get(self, r)) if r == rid else get(self, r))


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_a_row_whose_state_block_is_not_in_its_table_is_a_contract_finding_through_a_run(monkeypatch, prefix_caching):
    """`row-state-in-table` through a run (the harness tests a row inline and calls check_row only
    when the row breaks a rule): r1, admitted on a prefix hit at step 6, has no block in the column
    its state goes to; with prefix caching off its table is empty (the state lives in column 0)."""
    from mambafuzz.sim.trace import Crash

    assert harness.run(shared_prefix_scenario(), prefix_caching=prefix_caching).crash is None
    _short_tables(monkeypatch, "r1")
    crash = harness.run(shared_prefix_scenario(), prefix_caching=prefix_caching).crash
    assert isinstance(crash, Crash) and crash.contract == worker_contract.ROW_STATE_IN_TABLE, crash
    assert crash.vllm_frame == worker_contract.SCHEDULER_OUTPUT and crash.step >= 6 and "r1 is scheduled up to token" in crash.message


@pytest.mark.parametrize("scheduling", ["sync", "async"])
@pytest.mark.parametrize("broken", ["count", "computed", "bool"])
def test_a_row_whose_counts_are_not_ints_is_a_contract_finding_through_a_run(monkeypatch, scheduling, broken):
    """`row-counts-are-integers` through a run: after schedule(), r1's rows have a count divided
    with `/` (so its start is a float too), or a float num_computed_tokens in what the worker is
    told (a float start, an int count), or a one-token row counted as `True` (an int start, a count that is not an int)."""
    from mambafuzz.model.scenario import with_scheduling
    from mambafuzz.sim.bridge import scheduler_session

    schedule = scheduler_session.SchedulerSession.schedule

    def broken_schedule(self):
        out = schedule(self)
        counts = out.num_scheduled_tokens
        if "r1" in counts:
            if broken == "count":
                counts["r1"] /= 1
            elif broken == "computed":  # what SchedulerOutput tells the worker, new or cached
                for new in out.scheduled_new_reqs:
                    if new.req_id == "r1":
                        new.num_computed_tokens /= 1
                cached = out.scheduled_cached_reqs
                if "r1" in cached.req_ids:
                    cached.num_computed_tokens[cached.req_ids.index("r1")] /= 1
            elif counts["r1"] == 1:
                counts["r1"] = True
        return out

    scenario = with_scheduling(shared_prefix_scenario(), scheduling)
    assert harness.run(scenario).crash is None
    monkeypatch.setattr(scheduler_session.SchedulerSession, "schedule", broken_schedule)
    crash = harness.run(scenario).crash
    assert crash is not None and crash.contract == worker_contract.ROW_COUNTS_ARE_INTEGERS, crash
    assert crash.vllm_frame == worker_contract.SCHEDULER_OUTPUT and "r1 is scheduled for" in crash.message


def test_a_schedule_that_returns_no_output_is_a_contract_finding_not_a_tool_failure(monkeypatch):
    """A vLLM whose schedule() returns None (a mutant that drops the return) gives a finding named
    by the broken rule, at the step it happens; the unmodified scheduler runs the same case clean."""
    from vllm.v1.core.sched.scheduler import Scheduler

    s = shared_prefix_scenario()
    assert harness.run(s).crash is None
    real = Scheduler.schedule
    calls = []

    def schedule_drops_output_at_step_2(self):
        calls.append(1)
        out = real(self)
        return None if len(calls) == 3 else out

    monkeypatch.setattr(Scheduler, "schedule", schedule_drops_output_at_step_2)
    crash = harness.run(s).crash
    assert crash is not None and crash.contract == worker_contract.SCHEDULE_RETURNS_OUTPUT, crash
    assert crash.vllm_frame == "scheduler-output" and crash.step == 2 and "NoneType" in crash.message


def test_each_batch_event_publishes_the_mamba_blocks_keyed_by_its_schedule_and_by_its_update(monkeypatch):
    """The harness reads the bridge's list of keyed blocks itself (`take_inserted`, inline): each
    step's event must name exactly the first mamba group's blocks keyed inside that step's
    schedule() (`published`) and inside its update_from_output (`published_on_update`)."""
    import collections
    import random

    from mambafuzz.model.generate import random_scenario
    from mambafuzz.model.scenario import with_scheduling
    from mambafuzz.sim.bridge import scheduler_session

    keyed: dict = collections.defaultdict(list)  # (step, phase) -> block ids, in order
    now = {"step": -1, "phase": None, "suffix": None}
    s = shared_prefix_scenario()
    map_type = type(scheduler_session.SchedulerSession(s.engine, 64, s.max_model_len(), None).block_pool.cached_block_hash_to_block)
    real_insert, real_step = map_type.insert, harness._Runner._engine_step
    real_schedule, real_feed = scheduler_session.SchedulerSession.schedule, scheduler_session.SchedulerSession.feed

    def insert(self, key, block):
        if now["phase"] is not None and key[-4:] == now["suffix"]:
            keyed[(now["step"], now["phase"])].append(block.block_id)
        return real_insert(self, key, block)

    def phase(name, real):
        def run(self, *args):
            now["phase"], now["suffix"] = name, self._mamba_key_suffix
            try:
                return real(self, *args)
            finally:
                now["phase"] = None
        return run

    def engine_step(self, step):
        now["step"] = step
        return real_step(self, step)

    monkeypatch.setattr(map_type, "insert", insert)
    monkeypatch.setattr(scheduler_session.SchedulerSession, "schedule", phase("schedule", real_schedule))
    monkeypatch.setattr(scheduler_session.SchedulerSession, "feed", phase("update", real_feed))
    monkeypatch.setattr(harness._Runner, "_engine_step", engine_step)
    rng = random.Random(7)
    published = on_update = 0
    for _ in range(30):
        keyed.clear()
        trace = harness.run(with_scheduling(random_scenario(rng), "async"))
        for step, event in trace.batches.items():
            assert list(event.published) == keyed[(step, "schedule")], step
            assert list(event.published_on_update) == keyed[(step, "update")], step
            published += len(event.published)
            on_update += len(event.published_on_update)
    assert published > 20, (published, on_update)


def test_a_scheduler_at_a_fixed_point_ends_the_run_as_a_stall_early():
    """Nothing scheduled, nothing in flight, no transfer and no input due for IDLE_STEPS_TO_STALL
    steps: vLLM's scheduler has no clock, so it would schedule nothing until the bound (1,183 steps
    for this case). The run stops there, with the same stall finding, and says why."""
    from pathlib import Path

    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.model.scenario import loads
    from mambafuzz.sim.engine import harness as harness_module

    case = Path(__file__).resolve().parents[2] / "corpus" / "untriaged" / "parked_loads_promotion_mamba_blocks_stall.json"
    s = loads(case.read_text())
    trace = harness_module.run(s)
    assert trace.hit_bound and trace.stopped_idle_at is not None
    assert len(trace.steps) < trace.step_bound // 10
    assert all(not rec.chunks for rec in trace.steps[-harness_module.IDLE_STEPS_TO_STALL:])
    finding = evaluate(s, "fixed", efficiency=False).verdict.primary
    assert finding.signature == "stall:step-bound" and "fixed point of the scheduler" in finding.message
