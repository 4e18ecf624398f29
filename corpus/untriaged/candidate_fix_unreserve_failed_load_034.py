"""Candidate fix for vLLM 0.34 (not for 0.32/0.33, which have no parked reservations): a failed
async load under `recompute` that is promoted back to WAITING drops its parked reservation instead
of refreshing it, so its own retry is not counted against itself (scheduler.py:3678-3679)."""
from mambafuzz.sim.patching import Rewrite

OLD = """\
            self._update_waiting_for_remote_kv(request)
            self._reserve_parked(request)
"""
NEW = """\
            load_failed = request_id in self.failed_recving_kv_req_ids
            self._update_waiting_for_remote_kv(request)
            if load_failed:  # mambafuzz candidate fix
                self._unreserve_parked(request)
            else:
                self._reserve_parked(request)
"""
PATCHES = [Rewrite("vllm.v1.core.sched.scheduler:Scheduler._handle_blocked_waiting_request", ((OLD, NEW),))]
