"""Candidate fix: pad only requests that already have computed tokens into speculative rows.

Why: a fresh 1-token prompt padded to 1 + num_spec_tokens rows is classified by the runner
as a spec-decode row, and the recurrent spec-decode kernels have no initial-state mask: the
row starts from whatever its recycled (never zeroed) mamba block holds. Padding exists to
keep decode batches uniform; a request with nothing computed is a prefill, not a decode.
A source edit of the installed `Scheduler.schedule`.
"""

from __future__ import annotations

from mambafuzz.sim.patching import Rewrite

PAD_CONDITION = """\
and not prefill_scheduled
and (scheduled_running_reqs or num_computed_tokens > 0)
"""

PAD_ONLY_DECODES = """\
and not prefill_scheduled
and num_computed_tokens > 0  # mambafuzz fix: a fresh prompt is no decode row
"""

PATCHES = [Rewrite("vllm.v1.core.sched.scheduler:Scheduler.schedule", ((PAD_CONDITION, PAD_ONLY_DECODES),))]
