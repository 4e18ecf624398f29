"""The bridge's read-only views of vLLM's state that the harness reads on its hot paths."""

from mambafuzz.model.generate import random_scenario
from mambafuzz.sim.bridge import scheduler_session
from mambafuzz.sim.engine import harness


def _group_tables(session: scheduler_session.SchedulerSession, rid: str) -> tuple[list[int], ...]:
    managers = session.scheduler.kv_cache_manager.coordinator.single_type_managers
    return tuple([block.block_id for block in managers[g].req_to_blocks.get(rid, ())] for g in session.mamba_groups)


def test_mamba_tables_are_each_mamba_groups_block_ids_in_group_order(monkeypatch):
    """Read at every scheduled row, for models with three mamba groups (the tiny model's unrolled
    path) and with more, and for a request vLLM holds no blocks for: `mamba_block_lists` hands out
    each group's own list (not a copy), and `mamba_tables` their block ids, group by group."""
    import random

    seen = []
    lists, ids = scheduler_session.SchedulerSession.mamba_block_lists, scheduler_session.SchedulerSession.mamba_tables

    def checked(self, rid):
        got = lists(self, rid)
        managers = self.scheduler.kv_cache_manager.coordinator.single_type_managers
        assert type(got) is tuple and len(got) == len(self.mamba_groups)
        assert all(mine is managers[g].req_to_blocks[rid] for mine, g in zip(got, self.mamba_groups))
        tables = ids(self, rid)
        assert tables == _group_tables(self, rid) and type(tables) is tuple
        assert all(type(t) is list for t in tables)
        seen.append(len(tables))
        return got

    monkeypatch.setattr(scheduler_session.SchedulerSession, "mamba_block_lists", checked)
    rng = random.Random(5)
    for _ in range(6):
        harness.run(random_scenario(rng))
    assert 3 in seen and len(set(seen)) > 1
    session = scheduler_session.SchedulerSession(random_scenario(rng).engine, 64, 4096, None, False)
    assert ids(session, "nobody") == ([],) * len(session.mamba_groups)
    assert lists(session, "nobody") == ((),) * len(session.mamba_groups)


def test_finished_statuses_are_the_ones_a_request_calls_finished():
    """`req.status in FINISHED_STATUSES` stands for `req.is_finished()` on the harness's hot paths."""
    import random

    session = scheduler_session.SchedulerSession(random_scenario(random.Random(3)).engine, 64, 4096, None, False)
    session.add_request("r0", [1, 2, 3, 4], 4, 0.0)
    req = session.request("r0")
    answers = set()
    for status in scheduler_session.RequestStatus:
        req.status = status
        assert req.is_finished() == (status in scheduler_session.FINISHED_STATUSES), status
        answers.add(req.is_finished())
    assert answers == {True, False}


def test_preempted_is_the_outputs_preempted_requests_and_the_shared_empty_set_refuses_changes():
    from types import SimpleNamespace

    import pytest

    for ids in (None, set()):
        none = scheduler_session.SchedulerSession.preempted(SimpleNamespace(preempted_req_ids=ids))
        assert none == set() and not none
        with pytest.raises(AttributeError):
            none.add("r0")  # type: ignore[attr-defined]
    ids = {"r0", "r2"}
    got = scheduler_session.SchedulerSession.preempted(SimpleNamespace(preempted_req_ids=ids))
    assert got == ids and got is not ids
