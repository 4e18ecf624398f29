"""The kinds of finding, one exception type each, so a crash-deduplicating fuzzer groups
them by type and location (`signature`)."""

from __future__ import annotations


class Finding(Exception):
    """Base of every oracle verdict other than clean."""

    kind = "finding"
    fails = True  # False for report-only kinds

    def __init__(self, message: str, location: str, step: int | None = None, request_id: str | None = None,
                 mechanism: str = ""):
        super().__init__(message)
        self.message = message
        self.location = location
        self.step = step
        self.request_id = request_id
        self.mechanism = mechanism  # how the wrong state got there (oracle.mechanism); "" when none applies

    @property
    def signature(self) -> str:
        """The coarse key (`kind:location`): what corpus `expected` tables and known bugs record."""
        return f"{self.kind}:{self.location}"

    @property
    def fine_signature(self) -> str:
        """The coarse key plus the mechanism (`kind:location|stop,admission,rule`): a campaign's
        fast first dedup key, so two bugs that poison a slot the same way stay apart."""
        return f"{self.signature}|{self.mechanism}" if self.mechanism else self.signature

    def to_json(self) -> dict:
        return {"kind": self.kind, "signature": self.signature, "fine_signature": self.fine_signature,
                "message": self.message, "step": self.step, "request": self.request_id}


class SlotHashMismatch(Finding):
    """(a) A mamba block published under a hash holds a different state than the hash claims."""

    kind = "slot_hash"


class ResumeStateMismatch(Finding):
    """(b) A request admitted with a prefix or connector hit restored the wrong state."""

    kind = "resume_state"


class StaleStateRead(Finding):
    """A running request's row started from a state that is not its own computed prefix."""

    kind = "stale_read"


class UninitRead(Finding):
    """A row with nothing computed started from whatever its block held, not from zeros: no
    prefix cache hit is involved, so it has one signature whichever run (prefix caching on, or
    off: same runner, mamba_cache_mode "none") showed it; the message says which."""

    kind = "uninit_read"


class NocacheStaleRead(Finding):
    """A row started from a wrong state and the run with prefix caching off (same runner,
    mamba_cache_mode "none") started the same row from a wrong state too: a model-runner bug
    that prefix caching does not cause (e.g. placeholder drafts kept in the running state)."""

    kind = "nocache_stale_read"


class OutputDivergence(Finding):
    """(c) The same scenario with prefix caching off generated different tokens."""

    kind = "output_divergence"


class Stall(Finding):
    """(d) Some request did not finish within the scenario's step bound."""

    kind = "stall"


class VllmCrash(Finding):
    """(e) vLLM itself raised."""

    kind = "vllm_crash"


class Inefficiency(Finding):
    """(f) The split under test does measurably more work, or caches less, than the reference."""

    kind = "efficiency"
    fails = False
