"""The finding vocabulary: the kinds of finding, one exception type each, so a
crash-deduplicating fuzzer groups them by type and location (`signature`); the registry of
oracles (`ORACLES`), which says for every kind whether it fails a run, which check reports it
beyond the built-in ones, and which assertion an exported vLLM test makes of it; and the
`Violation` a judge hands to triage (and a worker reports to the supervisor).

A new oracle is one module in mambafuzz/checks/ (its Finding subclass and its check function)
and one `register(Oracle(...))` line at the end of this file: `expected` tables
(mambafuzz.store.corpus), the judge (mambafuzz.checks.oracle), triage and the exporter
(mambafuzz.upstream.export) all read the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

CLEAN = "clean"  # the verdict of a run without findings (an `expected` value, not a kind of finding)


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

    def concerns(self, request_id: str | None) -> bool:
        """Whether this finding is about `request_id`."""
        return request_id is not None and request_id == self.request_id

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

    def __init__(self, message: str, location: str, step: int | None = None, request_id: str | None = None,
                 mechanism: str = "", unfinished: tuple[str, ...] = ()):
        super().__init__(message, location, step, request_id, mechanism)
        self.unfinished = unfinished  # every request left unfinished (request_id: the first)

    def concerns(self, request_id: str | None) -> bool:
        return request_id in self.unfinished or super().concerns(request_id)


class VllmCrash(Finding):
    """(e) vLLM itself raised."""

    kind = "vllm_crash"


class Inefficiency(Finding):
    """(f) The split under test does measurably more work, or caches less, than the reference."""

    kind = "efficiency"
    fails = False


# ---- the violation a judge reports --------------------------------------------------------
@dataclass(frozen=True)
class Violation:
    """A failing input's verdict, the same whichever judge gave it (the oracles, the conform
    target): its coarse signature (what repro, minimizing and attribution match), its message,
    and its fine signature (the coarse one plus the mechanism: a campaign's dedup key; None
    when the judge has nothing finer).  It crosses the worker boundary in `finding` events
    (mambafuzz.search.worker_protocol): `to_json` on the worker's side, `from_json` on the
    supervisor's."""

    signature: str
    message: str = ""
    fine_signature: str | None = None
    # How far past its base the input goes (efficiency_regression: the figures' differences summed
    # over the figures it is worse on); 0 for every other kind. Triage keeps the largest per fine
    # signature (PerfFuzz keeps the input that maximises a resource; here the resource is the gap).
    gap: int = 0

    @property
    def fine(self) -> str:
        """The dedup key: the fine signature, else the coarse one."""
        return self.fine_signature or self.signature

    @property
    def kind(self) -> str:
        return kind_of(self.signature)

    @classmethod
    def of(cls, finding: Finding) -> Violation:
        return cls(finding.signature, finding.message, finding.fine_signature)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"signature": self.signature, "message": self.message,
                                "fine_signature": self.fine_signature}
        if self.gap:
            data["gap"] = self.gap
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Violation:
        """From `to_json`'s keys (other keys, e.g. the rest of an event, are ignored)."""
        fine = data.get("fine_signature")
        return cls(str(data["signature"]), str(data.get("message") or ""), None if fine is None else str(fine),
                   int(data.get("gap") or 0))


def kind_of(signature: str) -> str:
    """The kind a signature (`kind:location[|mechanism]`) names."""
    return signature.split(":")[0]


# ---- the oracle registry ----------------------------------------------------------------
def _no_assertion(location: str) -> str | None:
    return None


@dataclass(frozen=True)
class Oracle:
    """One kind of finding and what the tool does with it beyond finding it.

    `check`: "package.module:function", a check `(cached trace, uncached trace or None) ->
    Finding | list[Finding] | None` that mambafuzz.checks.oracle.judge runs; the shipped checks are
    registered below exactly as a plug-in is.  `also_reports`: further kinds the check may report
    (one check finds several kinds where their root-cause order is its own, as the state checks'
    earliest step is); such a kind is registered with no check of its own.  `export`: the
    assertion an exported vLLM test makes of a finding of this kind, by its location (the
    name of a check in mambafuzz/upstream's templates), or None where there is none yet.
    `follows_from`: kinds whose finding about the same request causes a finding of this kind;
    when a verdict holds both, an export asserts the cause (`exported_finding`).
    `order`: where a check's findings stand among a verdict's, the first being the primary one
    (the one a case is filed under); lower first, equal orders keep registration order.  The
    shipped root-cause checks stand at BUILT_IN_ORDER and just after it (crash, wrong states,
    divergence, stall): a plug-in below BUILT_IN_ORDER comes before them all, one with the
    default order after them, with the resource checks."""

    kind: str
    fails: bool = True  # False: report-only (never an `expected` verdict)
    check: str | None = None
    export: Callable[[str], str | None] = _no_assertion
    follows_from: tuple[str, ...] = ()
    order: int = 100
    also_reports: tuple[str, ...] = ()

    @classmethod
    def of(cls, finding: type[Finding], **kw: Any) -> Oracle:
        return cls(finding.kind, fails=finding.fails, **kw)


ORACLES: dict[str, Oracle] = {}
BUILT_IN_ORDER = 50  # where the shipped root-cause checks start (`Oracle.order`)


def register(oracle: Oracle) -> Oracle:
    if oracle.kind == CLEAN or ":" in oracle.kind or oracle.kind in ORACLES:
        raise ValueError(f"cannot register oracle kind {oracle.kind!r}")
    ORACLES[oracle.kind] = oracle
    return oracle


def verdict_kinds() -> tuple[str, ...]:
    """What an `expected` table may say a split does with a case: clean, or a failing kind."""
    return (CLEAN, *(kind for kind, o in ORACLES.items() if o.fails))


def export_assertion(signature: str) -> str | None:
    """The exported test's assertion for a finding with `signature`, or None."""
    kind, _, location = signature.partition(":")
    oracle = ORACLES.get(kind)
    return None if oracle is None else oracle.export(location)


def exported_finding(findings: Sequence[Finding]) -> Finding | None:
    """The finding an exported test asserts, of a verdict's failing findings (primary first): the
    primary one, unless its oracle says it follows from a kind of which a later finding concerns
    the same request; then that one.  So a stalled request's missing tokens
    (`output_divergence`, compared only when the run with prefix caching off finished) are
    exported as the stall they follow from."""
    if not findings:
        return None
    primary = findings[0]
    causes = ORACLES[primary.kind].follows_from if primary.kind in ORACLES else ()
    return next((f for f in findings[1:] if f.kind in causes and f.concerns(primary.request_id)), primary)


# The exported tests' assertions (mambafuzz/upstream/*_template.py name their checks so).
PUBLISHED_STATE_WRITTEN = "published_state_written"  # every newly published block's state was written there
NO_CRASH = "no_crash"  # schedule() does not raise
FRESH_PROMPT_NOT_SPEC_ROW = "fresh_prompt_not_spec_row"  # no request without computed tokens gets drafts
V1_ACCEPTED_KEPT = "v1_accepted_kept"  # a check of V1's persistent batch, not of the scheduler
EVERY_REQUEST_FINISHES = "every_request_finishes"  # within the step bound; names each request left unfinished
POOL_COUNTS_CONSISTENT = "pool_counts_consistent"  # free count == unreferenced blocks, none negative, all free at the end
LONE_REQUEST_WITHIN_RESERVE = "lone_request_within_reserve"  # a request alone holds no more than the start-up reserve


def _padded_fresh_prompt(location: str) -> str | None:
    return FRESH_PROMPT_NOT_SPEC_ROW if location == "from-empty" else None


def _nocache_read(location: str) -> str | None:
    if location.endswith("/accepted-reset"):
        return V1_ACCEPTED_KEPT
    if location.endswith("/prefill-kept-drafts"):
        return FRESH_PROMPT_NOT_SPEC_ROW
    return None


def _stall_assertion(location: str) -> str | None:
    # `wall-clock` is the harness's own time, and `nocache-step-bound` needs a scheduler with
    # prefix caching off, which the exported hybrid scheduler is not: neither is exported yet
    return EVERY_REQUEST_FINISHES if location == "step-bound" else None


# The shipped root-cause checks (mambafuzz/checks/oracle.py), in their order: a crash, then the
# earliest wrong state, then a divergence of outputs, then a stall.  Registration order is the order
# `expected` tables and messages list the kinds in.
register(Oracle.of(SlotHashMismatch, export=lambda location: PUBLISHED_STATE_WRITTEN, check="mambafuzz.checks.oracle:state_checks",
                   order=BUILT_IN_ORDER + 1,
                   also_reports=("resume_state", "stale_read", "uninit_read", "nocache_stale_read")))
register(Oracle.of(ResumeStateMismatch))  # these four: reported by slot_hash's check (state_checks)
register(Oracle.of(StaleStateRead, export=_padded_fresh_prompt))  # stale_read:from-empty is uninit_read's old name
register(Oracle.of(UninitRead, export=_padded_fresh_prompt))
register(Oracle.of(NocacheStaleRead, export=_nocache_read))
# The attention blocks a hit serves (mambafuzz/checks/attention_kv.py): a wrong state too, after the mamba states
register(Oracle("attention_kv", check="mambafuzz.checks.attention_kv:check_attention_hits", order=BUILT_IN_ORDER + 1))
register(Oracle.of(OutputDivergence, follows_from=("stall",),  # a stalled request's tokens never came
                   check="mambafuzz.checks.oracle:outputs_check", order=BUILT_IN_ORDER + 2))
register(Oracle.of(Stall, export=_stall_assertion, check="mambafuzz.checks.oracle:liveness_check", order=BUILT_IN_ORDER + 3,
                   also_reports=("vllm_crash",)))  # the run with prefix caching off crashing: it did not complete
register(Oracle.of(VllmCrash, export=lambda location: NO_CRASH, check="mambafuzz.checks.oracle:crash_check", order=BUILT_IN_ORDER))
# The engine's reset_prefix_cache (mambafuzz/checks/cache_reset.py): a reset that leaves keys is the root cause of
# any wrong state a later hit on them reads, so it stands just after a crash, before the state checks.
register(Oracle("prefix_cache_reset", check="mambafuzz.checks.cache_reset:check_prefix_cache_resets",
                order=BUILT_IN_ORDER))
# Judged against a reference split's trace (checks.oracle.judge's `reference`), which no check of one
# run pair sees: a report, or a finding under strict efficiency.
register(Oracle.of(Inefficiency))
# The resource oracles (mambafuzz/checks/resources.py): judged after the built-in checks, so a wrong
# state, a crash or a stall stays the primary finding of a run that also wastes resources.
register(Oracle("missed_hit", check="mambafuzz.checks.resources:check_missed_hits"))
register(Oracle("capacity", check="mambafuzz.checks.resources:check_capacity",
                export=lambda location: None if "allocation-over-estimate" in location else LONE_REQUEST_WITHIN_RESERVE))
register(Oracle("pool_accounting", check="mambafuzz.checks.resources:check_pool_accounting",
                export=lambda location: POOL_COUNTS_CONSISTENT))
# The attention groups' prefix-cache keys (mambafuzz/checks/cache_keys.py): a cached attention block carries its
# request's hash at its position. No exported assertion yet.
register(Oracle("attention_key", check="mambafuzz.checks.cache_keys:check_attention_keys"))
# PR mode's efficiency gate (mambafuzz/search/pr/efficiency_gate.py): judged against the base's figures by the
# campaign's judge, not by a check of one run's traces.
register(Oracle("efficiency_regression"))
