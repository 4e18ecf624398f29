"""Candidate fix: a failed async load under `recompute` ends the request's in-flight prefill, so
it leaves `Scheduler._inflight_prefills`; its next admission re-adds it."""
from mambafuzz.sim.patching import Rewrite

OLD = """\
            self.failed_recving_kv_req_ids.remove(request.request_id)
"""
NEW = """\
            self.failed_recving_kv_req_ids.remove(request.request_id)
            self._inflight_prefills.discard(request)  # mambafuzz candidate fix
"""
PATCHES = [Rewrite("vllm.v1.core.sched.scheduler:Scheduler._update_waiting_for_remote_kv", ((OLD, NEW),))]
