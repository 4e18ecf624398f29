"""Pure functions from traces to findings.  Each check returns the first violation it sees
(a `Finding`), or None; `judge` runs the check of every oracle registered with one
(mambafuzz.findings.ORACLES; the shipped ones below are registered there like any plug-in), and
orders their findings as the registry declares (`Oracle.order`: the shipped checks from
BUILT_IN_ORDER on, the resource checks after them)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from mambafuzz.findings import (
    CLEAN,
    ORACLES,
    Finding,
    Inefficiency,
    NocacheStaleRead,
    OutputDivergence,
    ResumeStateMismatch,
    SlotHashMismatch,
    StaleStateRead,
    Stall,
    UninitRead,
    Violation,
    VllmCrash,
)
from mambafuzz.sim.state import State
from mambafuzz.sim.trace import CacheEntry, Chunk, SlotWrite, StepRecord, Trace


def _relation(held: State, claimed: State) -> str:
    """A coarse class of how a held state differs from the claimed one (for signatures)."""
    if held.num_tokens == -1:
        return "zeroed"
    if held.num_tokens < -1:
        return "never-written"
    if held.num_tokens < claimed.num_tokens:
        return "short"
    if held.num_tokens > claimed.num_tokens:
        return "long"
    return "foreign"


def _writer(trace: Trace, block_id: int, before_step: int) -> tuple[StepRecord, SlotWrite] | None:
    """The step and write that last wrote `block_id` up to `before_step`."""
    for rec in reversed(trace.steps[: before_step + 1]):
        for w in reversed(rec.writes):
            if w.block_id == block_id:
                return rec, w
    return None


def last_write(trace: Trace, block_id: int, before_step: int) -> tuple[str, str]:
    """Who last wrote `block_id`: (sentence for the message, write cause for the signature)."""
    found = _writer(trace, block_id, before_step)
    if found is None:
        return "never written by any modelled kernel", "unwritten"
    rec, w = found
    chunk = next((c for c in rec.chunks if c.request_id == w.request_id), None)
    span = f" (chunk {chunk.start}..{chunk.end})" if chunk else ""
    return f"last written at step {rec.step} by {w.request_id} [{w.cause}]{span}", w.cause


# ---- the mechanism: the finer half of a signature ---------------------------------------
def chunk_stop(trace: Trace, rec: StepRecord, c: Chunk) -> str:
    """What ended chunk `c` of step `rec`: the request's end (or a decode row), the long-prefill
    threshold, the step's token budget, a block boundary, or none of these (a mid-block stop)."""
    prompt = trace.prompt_lens.get(c.request_id)
    if prompt is not None and c.start >= prompt:
        return "decode"
    if prompt is not None and c.end >= prompt:
        return "request-end"
    if trace.long_prefill_threshold and c.num_tokens - c.num_drafts == trace.long_prefill_threshold:
        return "long-prefill"
    if trace.token_budget and sum(x.num_tokens for x in rec.chunks) >= trace.token_budget:
        return "token-budget"
    if trace.mamba_block_size and c.end % trace.mamba_block_size == 0:
        return "block-end"
    return "mid-block"


def admission_path(trace: Trace, request_id: str, step: int) -> str:
    """How `request_id` was last admitted up to `step`: fresh, with a prefix hit, through the
    connector (sync or async load), or resumed after a preemption."""
    admitted_at, admission = None, None
    for rec in trace.steps[: step + 1]:
        for a in rec.admissions:
            if a.request_id == request_id:
                admitted_at, admission = rec.step, a
    if admission is None:
        return "unadmitted"
    if any(request_id in rec.preempted for rec in trace.steps[:admitted_at]):
        return "resumed"
    if admission.external_tokens:
        return "connector-async" if admission.external_async else "connector-sync"
    return "prefix-hit" if admission.local_hit_tokens else "fresh"


def mechanism(trace: Trace, block_id: int, step: int, owner: str, written_by: int | None = None) -> str:
    """`stop,admission,rule` for a wrong state in `block_id` seen at `step`: what ended the chunk
    that last wrote the block, how its owning request was admitted, and which runner rule wrote
    it (chunk-end, precopy, postcopy, checkpoint, spec-token, cow, connector, zero). The write
    is looked for up to `written_by` (default `step`; a read looks before its own step)."""
    found = _writer(trace, block_id, step if written_by is None else written_by)
    if found is None:
        return f"unwritten,{admission_path(trace, owner, step)},none"
    rec, w = found
    chunk = next((c for c in rec.chunks if c.request_id == w.request_id), None)
    stop = chunk_stop(trace, rec, chunk) if chunk is not None else "no-chunk"
    return f"{stop},{admission_path(trace, owner, step)},{w.cause}"


def holds_other_state(e: CacheEntry) -> bool:
    """The block under this key does not hold the state the key claims."""
    return e.held != e.claimed


def records_other_count(e: CacheEntry) -> bool:
    """The block's own key records a block_hash_num_tokens its hash does not cover."""
    return e.primary and e.recorded_tokens is not None and e.recorded_tokens != e.claimed.num_tokens


def slot_hash_poisoned(e: CacheEntry) -> bool:
    """Whether `check_slot_hashes` reports this entry: the one predicate for a published mamba
    block, which the runtime audit plugin applies to a live engine's entries too."""
    return holds_other_state(e) or records_other_count(e)


def check_slot_hashes(trace: Trace) -> Finding | None:
    """(a) After every step, each mamba block under a hash holds the state the hash claims."""
    for rec in trace.steps:
        for e in rec.cache:
            if holds_other_state(e):
                rel = _relation(e.held, e.claimed)
                writer, cause = last_write(trace, e.block_id, rec.step)
                # "+ckpt": a row ran across the claimed boundary and either exported an internal
                # prefill checkpoint, or started mid-block in an engine that exports them (the
                # split's checkpoint exemption can be decided for a chunk that is clipped later
                # and then writes none). That separates the checkpoint-exemption class from
                # plain fragmented chunks.
                crossing = [c for c in rec.chunks if c.start < e.claimed.num_tokens < c.end]
                crossing_ids = {c.request_id for c in crossing}
                mid_block = trace.internal_checkpoints and trace.mamba_block_size and any(
                    c.start % trace.mamba_block_size for c in crossing)
                if mid_block or any(w.request_id in crossing_ids and w.cause == "checkpoint" for w in rec.writes):
                    cause += "+ckpt"
                return SlotHashMismatch(
                    f"step {rec.step}: mamba block {e.block_id} (slot {e.column} of {e.claimed_by}) is published "
                    f"as the state after {e.claimed.num_tokens} tokens but holds {e.held} ({rel}); {writer}",
                    location=f"{rel}/{cause}", step=rec.step, request_id=e.claimed_by,
                    mechanism=mechanism(trace, e.block_id, rec.step, e.claimed_by),
                )
            if records_other_count(e):
                return SlotHashMismatch(
                    f"step {rec.step}: mamba block {e.block_id} records block_hash_num_tokens="
                    f"{e.recorded_tokens} but its hash covers {e.claimed.num_tokens} tokens",
                    location="recorded-count", step=rec.step, request_id=e.claimed_by,
                )
    return None


def wrong_reads(trace: Trace | None) -> set[tuple[str, int]]:
    """(request, start) of every row in `trace` that started from a state not its own."""
    if trace is None:
        return set()
    return {(c.request_id, c.start) for rec in trace.steps for c in rec.chunks if c.read_state != c.true_state}


KEPT_DRAFTS = "chunk-end+drafts"  # a prefill-kernel row stored its state after its draft positions


def _read_finding(step: int, c, shared: bool, nocache: bool = False, cause: str = "",
                  after_reset: bool = False) -> Finding:
    """The finding for one row `c` that started from a wrong state. `shared`: the other run
    (prefix caching on vs off) started the same row from a wrong state too; `nocache`: `c` is
    a row of the run with prefix caching off; `cause`: the last write to the block it read.

    A state left by a prefill-kernel row that kept its draft positions is the runner's doing in
    either cache mode (the row classification ignores the mode), so it gets one signature,
    whichever run's schedule happened to show it."""
    rel = _relation(c.read_state, c.true_state)
    if after_reset and c.start > 0:
        return NocacheStaleRead(
            f"step {step}: {c.request_id} ran tokens {c.start}..{c.end} from block {c.read_block} "
            f"(column {c.read_column}) holding {c.read_state}, expected {c.true_state} ({rel}): its first row "
            f"after V1 re-added it with an accepted-token count of 1{' (prefix caching off)' if nocache else ''}",
            location=f"{rel}/accepted-reset", step=step, request_id=c.request_id,
        )
    if cause == KEPT_DRAFTS and c.start > 0:
        return NocacheStaleRead(
            f"step {step}: {c.request_id} ran tokens {c.start}..{c.end} from block {c.read_block} "
            f"(column {c.read_column}) holding {c.read_state}, expected {c.true_state} ({rel}): a prefill-kernel "
            f"row stored the state after its draft positions{' (prefix caching off)' if nocache else ''}",
            location=f"{rel}/prefill-kept-drafts", step=step, request_id=c.request_id,
        )
    held = (f"{c.read_state}: bytes no modelled kernel of this group wrote, left by the block's "
            "earlier user (another KV-cache group or request)" if c.read_state.num_tokens < -1 else str(c.read_state))
    where = f"from block {c.read_block} (column {c.read_column}) holding {held}"
    prefix = "nocache-" if nocache else ""
    if c.start == 0:  # with nothing computed no prefix-cache entry is involved, whichever run shows it
        return UninitRead(
            f"step {step}: {c.request_id} ran tokens 0..{c.end} with nothing computed {where}, not from zeros"
            f"{'; prefix caching off does the same' if shared else ''}{' (prefix caching off)' if nocache else ''}",
            location="from-empty",  # the runner's row classification, in either cache mode: one signature
            step=step, request_id=c.request_id,
        )
    if shared or nocache:
        return NocacheStaleRead(
            f"step {step}: {c.request_id} ran tokens {c.start}..{c.end} {where}, expected {c.true_state} ({rel})"
            f"{'; prefix caching off does the same' if shared else ''}",
            location=prefix + rel, step=step, request_id=c.request_id,
        )
    if c.resumed_from_hit:
        return ResumeStateMismatch(
            f"step {step}: {c.request_id} resumed at {c.start} tokens {where}, not its own {c.true_state} ({rel})",
            location=rel, step=step, request_id=c.request_id,
        )
    return StaleStateRead(
        f"step {step}: {c.request_id} ran tokens {c.start}..{c.end} {where}, expected {c.true_state} ({rel})",
        location=rel, step=step, request_id=c.request_id,
    )


def check_reads(trace: Trace, uncached: Trace | None = None) -> Finding | None:
    """(b) Every row starts from the true state of the request's own computed prefix; on the
    first row after a prefix or connector hit this is the resume check.

    A row with nothing computed that reads its block is `uninit_read`; a wrong read that the
    run with prefix caching off (`uncached`: the same runner in mamba_cache_mode "none") makes
    on the same row is `nocache_stale_read`. Neither is prefix-cache poisoning."""
    shared = wrong_reads(uncached)
    for rec in trace.steps:
        for c in rec.chunks:
            if c.read_state != c.true_state:
                cause = last_write(trace, c.read_block, rec.step - 1)[1]
                finding = _read_finding(rec.step, c, (c.request_id, c.start) in shared, cause=cause,
                                        after_reset=(rec.step, c.request_id) in trace.after_accepted_reset)
                finding.mechanism = mechanism(trace, c.read_block, rec.step, c.request_id, rec.step - 1)
                return finding
    # The other mamba groups' kernel models (one per group, mambafuzz/sim/engine/harness.py): the same rule per group.
    # Their writes are not in the trace, so no cause or mechanism is named.
    for step, group, c in trace.mamba_group_reads:
        finding = _read_finding(step, c, (c.request_id, c.start) in shared,
                                after_reset=(step, c.request_id) in trace.after_accepted_reset)
        finding.message = f"mamba KV-cache group {group + 1} (group 1 read its own state): {finding.message}"
        return finding
    return None


def check_nocache_reads(uncached: Trace, cached: Trace) -> Finding | None:
    """Wrong reads of the run with prefix caching off that the cached run does not share (the
    shared ones are judged on the cached run): a bug of the runner in mamba_cache_mode "none"."""
    own = wrong_reads(cached)
    for rec in uncached.steps:
        for c in rec.chunks:
            if c.read_state != c.true_state and (c.request_id, c.start) not in own:
                cause = last_write(uncached, c.read_block, rec.step - 1)[1]
                finding = _read_finding(rec.step, c, False, nocache=True, cause=cause,
                                        after_reset=(rec.step, c.request_id) in uncached.after_accepted_reset)
                finding.message = "prefix caching off: " + finding.message
                finding.mechanism = mechanism(uncached, c.read_block, rec.step, c.request_id, rec.step - 1)
                return finding
    return None


def check_liveness(trace: Trace) -> Finding | None:
    """(d) Every request finishes within the scenario's step bound (and the run within its
    wall-clock bound)."""
    if trace.timed_out:
        return Stall(f"the run exceeded its wall-clock bound after {len(trace.steps)} steps",
                     location="wall-clock", step=len(trace.steps))
    if trace.hit_bound or trace.unfinished:
        names = ", ".join(trace.unfinished) or "some request"
        why = (f" (from step {trace.stopped_idle_at} on, nothing was scheduled, in flight or due: a fixed point of "
               "the scheduler, so the run stopped there)" if trace.stopped_idle_at is not None else "")
        return Stall(f"{names} did not finish within {trace.step_bound} steps{why}",
                     location="step-bound", step=len(trace.steps), request_id=(trace.unfinished or [None])[0],
                     unfinished=tuple(trace.unfinished))
    return None


def check_crash(trace: Trace) -> Finding | None:
    """(e) An exception raised inside vLLM, located by vLLM's innermost frame."""
    c = trace.crash
    if c is None:
        return None
    frame = c.vllm_frame.split(":")[0] + ":" + c.vllm_frame.split(" in ")[-1] if " in " in c.vllm_frame else c.vllm_frame
    return VllmCrash(f"step {c.step}: {c.exc_type}: {c.message} (at {c.vllm_frame})",
                     location=f"{c.exc_type}@{frame}", step=c.step, mechanism=c.contract)


def runner_caused_reads(trace: Trace) -> set[str]:
    """Requests with a wrong read that the model runner causes in either cache mode: nothing
    computed (uninit), a state a prefill row left with its drafts, or V1's accepted-count reset."""
    out = set()
    for rec in trace.steps:
        for c in rec.chunks:
            if c.read_state != c.true_state and (
                    c.start == 0 or (rec.step, c.request_id) in trace.after_accepted_reset
                    or last_write(trace, c.read_block, rec.step - 1)[1] == KEPT_DRAFTS):
                out.add(c.request_id)
    return out


NO_COMPLETION = ("FINISHED_ABORTED", "FINISHED_ERROR")


def check_outputs(cached: Trace, uncached: Trace) -> Finding | None:
    """(c) Prefix caching must not change what any request generates (aborted ones excepted,
    and ones whose run with prefix caching off read a wrong state itself, or whose cached run
    read one the runner causes in either mode: those reads are findings of their own).
    A continuation is compared only when both runs gave it the same prompt: each run builds it
    from what the earlier request held when it ended, and an abort at a fixed step catches that
    request at different points in the two runs (different prompts, nothing to compare). When
    the earlier request's own outputs diverged, that request is the finding. A request the cached
    run left unfinished, whose tokens so far are the start of the other run's, has no completion
    either: it stopped, it did not generate something else, and `check_liveness` names the stall
    (the cause) rather than this check naming its symptom."""
    broken = {rid for rid, _ in wrong_reads(uncached)}
    stalled = set(cached.unfinished)
    if wrong_reads(cached):
        broken |= runner_caused_reads(cached)
    # Aborted requests, and requests vLLM failed on purpose (a KV load failure under
    # kv_load_failure_policy "fail": Scheduler.update_from_output finishes them FINISHED_ERROR and
    # the client gets an error, not tokens), have no completion to compare.
    for rid, tokens in cached.outputs.items():
        if cached.finish_status.get(rid) in NO_COMPLETION or uncached.finish_status.get(rid) in NO_COMPLETION:
            continue
        if rid in broken:
            continue
        if (cached.continuations or uncached.continuations) and cached.continuations.get(rid) != uncached.continuations.get(rid):
            continue
        other = uncached.outputs.get(rid)
        if other is None or other == tokens or (rid in stalled and other[:len(tokens)] == tokens):
            continue
        first = next((i for i, (a, b) in enumerate(zip(tokens, other)) if a != b), min(len(tokens), len(other)))
        return OutputDivergence(
            f"{rid}: output token {first} differs with prefix caching on ({tokens[first:first + 3]}...) "
            f"and off ({other[first:first + 3]}...)", location="tokens", request_id=rid,
        )
    return None


def check_efficiency(candidate: Trace, reference: Trace) -> Finding | None:
    """(f) Report-only: the candidate split took more forward steps, published fewer
    snapshots, or hit fewer prefix tokens than the reference split."""
    worse = []
    if candidate.forward_steps > reference.forward_steps:
        worse.append(f"forward steps {candidate.forward_steps} vs {reference.forward_steps}")
    if candidate.hashed_snapshots < reference.hashed_snapshots:
        worse.append(f"hashed snapshots {candidate.hashed_snapshots} vs {reference.hashed_snapshots}")
    if candidate.prefix_hit_tokens < reference.prefix_hit_tokens:
        worse.append(f"prefix-hit tokens {candidate.prefix_hit_tokens} vs {reference.prefix_hit_tokens}")
    if not worse:
        return None
    return Inefficiency(f"split {candidate.split} vs {reference.split}: " + "; ".join(worse),
                        location="+".join(w.split(" ")[0] for w in worse))


@dataclass
class Verdict:
    findings: list[Finding] = field(default_factory=list)  # failing kinds first, in check order
    reports: list[Finding] = field(default_factory=list)  # report-only kinds

    @property
    def clean(self) -> bool:
        return not self.findings

    @property
    def primary(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    @property
    def kind(self) -> str:
        return self.primary.kind if self.primary else CLEAN

    @property
    def violation(self) -> Violation | None:
        """The primary finding as a judge reports it (None: clean)."""
        return None if self.primary is None else Violation.of(self.primary)


# ---- the shipped checks as the registry runs them ------------------------------------------
# Each takes the registry's arguments (the cached run's trace, the uncached one's or None) and
# holds the root-cause rule of its place: mambafuzz.findings registers them at BUILT_IN_ORDER and
# the orders after it, so a crash comes first, then the earliest wrong state, then a divergence,
# then a stall.
def crash_check(cached: Trace, uncached: Trace | None = None) -> Finding | None:
    """(e) vLLM raised in the cached run."""
    return check_crash(cached)


def state_checks(cached: Trace, uncached: Trace | None = None) -> list[Finding]:
    """(a), (b) Wrong states, ordered by step: the earliest wrong state is the root cause, and its
    signature is the one a finding is filed and deduplicated under."""
    nocache_reads = check_nocache_reads(uncached, cached) if uncached is not None else None
    found = [f for f in (check_slot_hashes(cached), check_reads(cached, uncached), nocache_reads) if f is not None]
    found.sort(key=lambda f: f.step if f.step is not None else 1 << 30)
    return found


def outputs_check(cached: Trace, uncached: Trace | None = None) -> Finding | None:
    """(c) Compared only when both runs completed (a crash or an unfinished run with prefix
    caching off has no tokens to compare against)."""
    if uncached is None or cached.crash is not None or uncached.crash is not None or uncached.unfinished:
        return None
    return check_outputs(cached, uncached)


def liveness_check(cached: Trace, uncached: Trace | None = None) -> list[Finding]:
    """(d) The cached run's stall (none after a crash, which is its own finding), then the run with
    prefix caching off failing to complete (a crash or a stall there), named as that run's."""
    found = [check_liveness(cached)] if cached.crash is None else []
    if uncached is not None:
        other = check_crash(uncached) or check_liveness(uncached)
        if other is not None:
            other.message = "prefix caching off: " + other.message
            other.location = "nocache-" + other.location
            found.append(other)
    return [f for f in found if f is not None]


def judge(cached: Trace, uncached: Trace | None = None, reference: Trace | None = None,
          strict_efficiency: bool = False) -> Verdict:
    """Every registered oracle's check, failing findings in declared order (the first is the
    primary finding), report-only ones apart; then, given a reference split's trace, the efficiency
    comparison (a report unless `strict_efficiency`), which no check of one run pair can make."""
    verdict = Verdict()
    failing = []
    for order, found in registered_findings(cached, uncached):
        (failing.append((order, found)) if found.fails else verdict.reports.append(found))
    # sorted by declared order; sort() is stable, so equal orders keep registration order
    verdict.findings = [f for _, f in sorted(failing, key=lambda p: p[0])]
    if reference is not None:
        eff = check_efficiency(cached, reference)
        if eff is not None:
            (verdict.findings if strict_efficiency else verdict.reports).append(eff)
    return verdict


Check = Callable[[Trace, "Trace | None"], "Finding | list[Finding] | None"]


@cache
def _check_function(path: str) -> Check:
    module, _, name = path.partition(":")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"oracle check {path!r} is not a callable module:function")
    return fn


def registered_findings(cached: Trace, uncached: Trace | None = None) -> list[tuple[int, Finding]]:
    """What the registered oracles' checks report, each finding with its oracle's declared order
    (`Oracle.order`).  A check named by several oracles runs once; it may report its oracle's kind
    and the kinds the oracle declares it also reports (`Oracle.also_reports`), no other."""
    out = []
    ran: set[str] = set()
    for oracle in list(ORACLES.values()):
        if oracle.check is None or oracle.check in ran:
            continue
        ran.add(oracle.check)
        found = _check_function(oracle.check)(cached, uncached)
        for f in (found if isinstance(found, list) else [] if found is None else [found]):
            if f.kind != oracle.kind and f.kind not in oracle.also_reports:
                raise ValueError(f"oracle {oracle.kind}'s check {oracle.check} reported a {f.kind} finding")
            out.append((oracle.order, f))
    return out
