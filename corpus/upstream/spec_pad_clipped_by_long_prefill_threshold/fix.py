"""Candidate fix: after `long_prefill_token_threshold` clips a padded speculative row, drop
the padding (the same repair the align split already applies after its own clip).

Why: the waiting branch of `Scheduler.schedule` pads a new 1-token request to
1 + num_spec_tokens rows, then the threshold clip shortens it and leaves `pad_spec_decode`
set, so `assert num_new_tokens == 1 + self.num_spec_tokens` fires without an align split.
A source edit of the installed `Scheduler.schedule`; it stops applying (and says so) when
the edited lines change.
"""

from __future__ import annotations

from mambafuzz.sim.patching import Rewrite

THRESHOLD_CLIP = """\
if 0 < long_prefill_token_threshold < num_new_tokens:
    num_new_tokens = long_prefill_token_threshold

# chunked prefill has to be enabled explicitly to allow
"""

THRESHOLD_CLIP_KEEPS_ROWS = """\
if 0 < long_prefill_token_threshold < num_new_tokens:
    num_new_tokens = long_prefill_token_threshold
    if pad_spec_decode and num_new_tokens != 1 + self.num_spec_tokens:
        num_new_tokens = 1  # mambafuzz fix: a clipped padded row is not a speculative row
        pad_spec_decode = False

# chunked prefill has to be enabled explicitly to allow
"""

PATCHES = [Rewrite("vllm.v1.core.sched.scheduler:Scheduler.schedule", ((THRESHOLD_CLIP, THRESHOLD_CLIP_KEEPS_ROWS),))]
