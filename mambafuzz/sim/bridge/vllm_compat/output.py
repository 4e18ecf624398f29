"""Reading a SchedulerOutput whose shape differs by release, without importing vLLM (the runtime
audit plugin reads one inside a serving vLLM through mambafuzz/sim/worker/worker_mirror.py)."""

from __future__ import annotations

from typing import Any


def resumed_req_ids(out: Any) -> set[str]:
    """The preempted requests `out` hands back to the worker as resumed (cached) ones. vLLM 0.34
    dropped `CachedRequestData.resumed_req_ids` (v1/core/sched/output.py:139-147) together with Model
    Runner V1: a resumed request comes back among `scheduled_new_reqs`, as V2 already had it in 0.32
    and 0.33 (their set was empty under V2), so there are none here."""
    return set(getattr(out.scheduled_cached_reqs, "resumed_req_ids", None) or ())
