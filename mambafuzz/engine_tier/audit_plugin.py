"""A runtime audit of a live vLLM engine's mamba prefix cache, as an opt-in general plugin.

Why: the harness proves poisoning under a simulated runner; a production engine cannot be
diffed against an uncached twin.  But the scheduler alone knows everything needed to tell
what each mamba block holds: which chunk ran (SchedulerOutput), into which block-table
column the kernel writes its end state, which copies the worker applies, and which hash
each newly cached block is published under.  This plugin replays those facts through
`mambafuzz.sim.worker.worker_mirror` (the step code the harness runs, over one kernel model per mamba group:
chunk-end writes, pre-copies, spec-token writes, post-copies, CoW copies, zeroing, internal
checkpoints) and checks every newly hashed mamba block with `mambafuzz.sim.engine.cache_audit` against the
state its hash claims (the state after exactly the tokens of the request that defined it),
judged by `mambafuzz.checks.oracle.slot_hash_poisoned`, the predicate of the harness's `slot_hash` finding.
Importing this module imports neither vLLM nor those modules: they load on the first step.

Enable: `MAMBAFUZZ_AUDIT=1` (the entry point `vllm.general_plugins: mambafuzz_audit` calls
`register()` in every vLLM process; without the variable it does nothing).  Each poisoned
entry is logged once (request, slot, block, claimed and held offsets); the running count is
logged every `MAMBAFUZZ_AUDIT_EVERY` steps (default 100) and exported as the Prometheus
counter `mambafuzz_poisoned_mamba_blocks_total` when prometheus_client is importable and the
scheduler logs stats.  Limits: a KV connector is trusted to load the true state of the
tokens it claims (its load is modelled as that write), and an entry whose hash the bounded
hash book no longer knows is counted (`unjudged`), not judged.

Each batch's worker side is replayed when its output comes back (`update_from_output`), not
when it is scheduled.  Under async scheduling (vLLM's `AsyncScheduler`, batches in flight) the
scheduler hands out a decode row before the token it runs on exists on the scheduler side: the
worker takes that token from the previous batch's sampled ids on the device
(`gpu_model_runner._prepare_input_ids`), its drafts are `-1` placeholders the worker fills
itself, and the row starts where the worker corrects the scheduler's optimistic count
(`deferred_spec_decode_corrections`).  When the batch's output arrives, every batch before it
has been applied, so the request holds the row's tokens, the sampled ids give the accepted
drafts, and the earlier batches' rejections give the correction.  Batches are replayed in the
order they were scheduled (the order the engine core applies them), and a publication is
judged once every batch scheduled before it has been replayed, as the harness judges it.
"""

from __future__ import annotations

import collections
import logging
import os
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("mambafuzz.audit")
ENV_ENABLE = "MAMBAFUZZ_AUDIT"
ENV_EVERY = "MAMBAFUZZ_AUDIT_EVERY"
COUNTER_NAME = "mambafuzz_poisoned_mamba_blocks_total"
_ATTR = "_mambafuzz_audit"
BOOK_LIMIT = 1 << 21
_PATCHED = False
_GENERATION = 0
_ORIGINALS: dict[tuple[type, str], Any] = {}
_COUNTER: Any = None
# The audits of the latest schedulers of this process (tests and in-process tools read them).
RECENT: collections.deque[SchedulerAudit] = collections.deque(maxlen=16)


@dataclass(frozen=True)
class Poisoned:
    """One prefix-cache entry whose block does not hold the state its hash claims."""

    step: int
    request_id: str  # the request whose tokens define the hash
    group: int
    column: int  # block-table slot the claim corresponds to
    block_id: int
    claimed_tokens: int
    held_tokens: int  # -1: zeroed, -2: never written
    held_matches_count: bool  # right offset, wrong tokens (another prefix's state)
    recorded_tokens: int | None = None  # a block_hash_num_tokens its hash does not cover (else None)

    def describe(self) -> str:
        if self.recorded_tokens is not None:
            what = f"records block_hash_num_tokens={self.recorded_tokens}"
        else:
            what = "holds " + ("the right offset but another prefix's state" if self.held_matches_count else (
                f"state@{self.held_tokens}" if self.held_tokens >= 0 else
                ("a zeroed block" if self.held_tokens == -1 else "a block never written")))
        return (f"mamba prefix-cache entry poisoned: request {self.request_id} group {self.group} slot {self.column} "
                f"(block {self.block_id}) claims state@{self.claimed_tokens}, {what} (step {self.step})")


@dataclass
class _Pending:
    key: Any  # BlockHashWithGroupId
    block_id: int
    after: int = 0  # judged once this many batches have been replayed (those scheduled by then)
    # (primary, block_hash_num_tokens) when an engine step last ended with it cached; None: not yet
    at_step_end: tuple[bool, int | None] | None = None


@dataclass(eq=False)
class _Row:
    """One scheduled row, as the scheduler handed it out (replayed when its output returns)."""

    rid: str
    req: Any  # vLLM's Request (kept: the scheduler may free it before the output returns)
    truth: Any  # PrefixStates of the request
    start: int  # the scheduler's num_computed_tokens before the row (optimistic under async)
    n: int
    drafts: list[int]  # as scheduled (-1: a placeholder the worker fills)
    tables: list[list[int]]  # block tables at schedule time, in model order
    num_prompt_tokens: int
    prefill_len: int
    load: bool  # a connector load at admission lands before the row


@dataclass(eq=False)
class _Batch:
    out: Any  # SchedulerOutput
    rows: list[_Row]
    before: list[_Batch]  # batches still in flight when it was scheduled
    rejected: dict[str, int] = field(default_factory=dict)  # drafts each row had rejected (after replay)


@dataclass
class SchedulerAudit:
    """The audit state of one Scheduler instance."""

    models: dict[int, Any]  # mamba group id -> KernelModel
    hash_block_size: int
    every: int
    spec_engine: bool  # the worker post-processes every row after a spec-decode forward
    generation: int  # the install() it belongs to: a re-install starts every scheduler afresh
    book: Any  # mambafuzz.sim.engine.hash_book.HashBook: hash -> (request, claimed State), as in the harness
    mirror: Any  # mambafuzz.sim.worker.worker_mirror.WorkerMirror over `models`, in their order
    auditors: dict[int, Any]  # mamba group id -> mambafuzz.sim.engine.cache_audit.BlockAuditor
    truths: dict[str, Any] = field(default_factory=dict)  # live request id -> PrefixStates
    pending: list[_Pending] = field(default_factory=list)
    in_flight: list[_Batch] = field(default_factory=list)  # scheduled, output not back yet, oldest first
    scheduled: int = 0  # schedule() calls
    replayed: int = 0  # batches replayed
    poisoned: list[Poisoned] = field(default_factory=list)
    checked: int = 0
    unjudged: int = 0  # published under a hash the bounded book had dropped
    steps: int = 0
    external_loads: set[str] = field(default_factory=set)  # admitted with connector tokens, not yet run
    prefill_len: dict[str, int] = field(default_factory=dict)  # tokens at the last (re)admission (V2)

    @property
    def count(self) -> int:
        return len(self.poisoned)


def enabled() -> bool:
    return os.environ.get(ENV_ENABLE, "") == "1"


def register() -> None:
    """The `vllm.general_plugins` entry point: patch the scheduler when MAMBAFUZZ_AUDIT=1."""
    if enabled():
        install()


def install() -> None:
    """Wrap Scheduler.schedule / update_from_output and BlockPool._insert_block_hash (once)."""
    global _PATCHED, _GENERATION
    if _PATCHED:
        return
    _GENERATION += 1
    from mambafuzz.sim.bridge.vllm_compat.api import BlockPool, KVCacheManager, Scheduler

    orig_schedule = Scheduler.schedule
    orig_update = Scheduler.update_from_output
    orig_insert = BlockPool._insert_block_hash
    orig_allocate = KVCacheManager.allocate_slots

    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        audit = _audit_for(self)
        if audit is not None:
            _safely(_step_ended, self, audit)
            audit.scheduled += 1
        out = orig_schedule(self, *args, **kwargs)
        if audit is not None:
            _safely(_after_schedule, self, audit, out)
        return out

    def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        audit = getattr(self, _ATTR, None)
        if audit is not None:  # before vLLM consumes the output: update_from_output may trim the sampled lists
            _safely(_replay, self, audit, scheduler_output, model_runner_output)
            _safely(_async_loads_done, self, audit, model_runner_output)
        result = orig_update(self, scheduler_output, model_runner_output)
        audit = getattr(self, _ATTR, None)
        if audit is not None:
            _safely(_after_update, self, audit)
        return result

    def insert_block_hash(self: Any, key: Any, block: Any, num_tokens: int | None) -> None:
        audit = getattr(self, _ATTR, None)
        fresh = audit is not None and not (
            block.block_hash == key or self.cached_block_hash_to_block.contain(key, block.block_id))
        orig_insert(self, key, block, num_tokens)
        if fresh:  # a publication (again, after an eviction or a reset, is a new one)
            audit.pending.append(_Pending(key, block.block_id, audit.scheduled))

    def allocate_slots(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        blocks = orig_allocate(self, request, *args, **kwargs)
        audit = getattr(self.block_pool, _ATTR, None)
        if audit is not None and blocks is not None and kwargs.get("num_external_computed_tokens", 0) > 0:
            audit.external_loads.add(request.request_id)
        return blocks

    _ORIGINALS.update({(Scheduler, "schedule"): orig_schedule, (Scheduler, "update_from_output"): orig_update,
                       (BlockPool, "_insert_block_hash"): orig_insert, (KVCacheManager, "allocate_slots"): orig_allocate})
    Scheduler.schedule = schedule
    Scheduler.update_from_output = update_from_output
    BlockPool._insert_block_hash = insert_block_hash
    KVCacheManager.allocate_slots = allocate_slots
    _PATCHED = True
    _configure_logger()


def uninstall() -> None:
    """Restore the unpatched vLLM methods (tests; a live engine keeps no audit after this)."""
    global _PATCHED
    for (cls, name), fn in _ORIGINALS.items():
        setattr(cls, name, fn)
    _ORIGINALS.clear()
    _PATCHED = False


def audit_of(scheduler: Any) -> SchedulerAudit | None:
    """The audit attached to a scheduler (None before its first step or when not auditing)."""
    return getattr(scheduler, _ATTR, None)


# ---- internals ------------------------------------------------------------------------

def _configure_logger() -> None:
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s mambafuzz-audit: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _safely(fn: Any, *args: Any) -> None:
    """The audit must never take the engine down: a failure disables it for that scheduler."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001
        logger.exception("audit failed; disabling it for this scheduler")
        sched = args[0]
        setattr(sched, _ATTR, None)
        sched.kv_cache_manager.block_pool.__dict__[_ATTR] = None


def _audit_for(sched: Any) -> SchedulerAudit | None:
    if _ATTR in sched.__dict__:
        known = sched.__dict__[_ATTR]
        if known is None or known.generation == _GENERATION:
            return known
    audit = None
    try:
        audit = _new_audit(sched)
    except Exception:  # noqa: BLE001
        logger.exception("audit could not attach to this scheduler")
    setattr(sched, _ATTR, audit)
    if audit is not None:
        sched.kv_cache_manager.block_pool.__dict__[_ATTR] = audit
        RECENT.append(audit)
    return audit


def _new_audit(sched: Any) -> SchedulerAudit | None:
    from mambafuzz.model import runners
    from mambafuzz.model.scenario import VOCAB_SIZE
    from mambafuzz.sim.bridge.vllm_compat.api import MambaSpec
    from mambafuzz.sim.worker.kernel_model import KernelGeometry, KernelModel

    groups = {i: g.kv_cache_spec for i, g in enumerate(sched.kv_cache_config.kv_cache_groups)
              if isinstance(g.kv_cache_spec, MambaSpec) and getattr(g.kv_cache_spec, "mamba_cache_mode", "") == "align"}
    if not groups or not sched.cache_config.enable_prefix_caching:
        return None
    managers = sched.kv_cache_manager.coordinator.single_type_managers
    null_id = sched.kv_cache_manager.block_pool.null_block.block_id
    models = {}
    spec_config = sched.vllm_config.speculative_config
    num_spec = (spec_config.num_speculative_tokens or 0) if spec_config is not None else 0
    runner = runners.picked_by_vllm(bool(getattr(sched, "use_v2_model_runner", False))).name
    for gid, spec in groups.items():
        checkpoints = getattr(spec, "num_prefill_checkpoint_blocks", 0)
        models[gid] = KernelModel(KernelGeometry(
            block_size=spec.block_size, hash_block_size=sched.hash_block_size,
            checkpoint_alignment=getattr(spec, "prefill_checkpoint_alignment", None) if checkpoints else None,
            cache_hit_alignment_tokens=getattr(managers[gid], "cache_hit_alignment_tokens", spec.block_size),
            drop_eagle_block=bool(getattr(sched, "use_eagle_block_drop", False)),
            null_block_id=null_id, vocab_size=VOCAB_SIZE, spec_engine=num_spec > 0,
            num_speculative_tokens=num_spec), runner=runner, mixer="mamba2" if checkpoints else "gdn")
    every = max(int(os.environ.get(ENV_EVERY, "100") or 100), 1)
    maybe_counter(sched)
    from mambafuzz.sim.engine.cache_audit import BlockAuditor
    from mambafuzz.sim.engine.hash_book import HashBook
    from mambafuzz.sim.worker.worker_mirror import WorkerMirror

    spec_engine = sched.vllm_config.speculative_config is not None
    book = HashBook(sched.hash_block_size, limit=BOOK_LIMIT)
    return SchedulerAudit(models, sched.hash_block_size, every, spec_engine, _GENERATION, book,
                          WorkerMirror(list(models.values()), spec_engine),
                          {g: BlockAuditor(book, models[g], s.block_size) for g, s in groups.items()})


def maybe_counter(sched: Any) -> None:
    global _COUNTER
    if _COUNTER is not None or not getattr(sched, "log_stats", False):
        return
    try:
        from prometheus_client import REGISTRY, Counter
    except ImportError:
        return
    try:
        _COUNTER = Counter(COUNTER_NAME.removesuffix("_total"),
                           "Mamba prefix-cache entries whose block does not hold the state their hash claims")
    except ValueError:  # already registered in this process (e.g. a second engine)
        _COUNTER = REGISTRY._names_to_collectors.get(COUNTER_NAME)


def _block_ids(sched: Any, gid: int, rid: str) -> list[int]:
    manager = sched.kv_cache_manager.coordinator.single_type_managers[gid]
    return [b.block_id for b in manager.req_to_blocks.get(rid, ())]


def _tables(sched: Any, audit: SchedulerAudit, rid: str) -> list[list[int]]:
    """The request's block table of each modelled group, in model order (the mirror's `tables`)."""
    return [_block_ids(sched, gid, rid) for gid in audit.models]


def _truth(audit: SchedulerAudit, req: Any) -> Any:
    from mambafuzz.sim.state import PrefixStates
    from mambafuzz.sim.worker.worker_mirror import extend_truth

    truth = audit.truths.get(req.request_id)
    if truth is None:
        truth = audit.truths[req.request_id] = PrefixStates()
    return extend_truth(truth, req)


def _learn(audit: SchedulerAudit, req: Any, truth: Any) -> None:
    audit.book.learn(req.request_id, req.block_hashes, truth)


def _after_schedule(sched: Any, audit: SchedulerAudit, out: Any) -> None:
    """Record what the worker is handed (it runs when the output comes back: `_replay`)."""
    for new_req in out.scheduled_new_reqs:  # V2 hands resumed requests over as new ones too
        req = sched.requests.get(new_req.req_id)
        if req is not None:
            audit.prefill_len[new_req.req_id] = req.num_tokens
    spec = out.scheduled_spec_decode_tokens
    rows = []
    for rid, n in out.num_scheduled_tokens.items():
        req = sched.requests.get(rid)
        if req is None:
            continue
        truth = _truth(audit, req)
        _learn(audit, req, truth)
        load = rid in audit.external_loads
        audit.external_loads.discard(rid)
        rows.append(_Row(rid, req, truth, req.num_computed_tokens - n,  # schedule() already advanced it
                         n, list(spec.get(rid, ())), _tables(sched, audit, rid), req.num_prompt_tokens,
                         audit.prefill_len.get(rid, req.num_prompt_tokens), load))
    audit.in_flight.append(_Batch(out, rows, list(audit.in_flight)))
    for rid in out.finished_req_ids:
        audit.truths.pop(rid, None)
        audit.book.forget(rid)
        audit.prefill_len.pop(rid, None)


def worker_drafts(scheduled: list[int], sampled: list[int] | None) -> list[int]:
    """The draft tokens a row ran, as far as its output tells: the drafts it kept are its sampled
    tokens; a rejected draft keeps what was scheduled (under async a `-1` placeholder, which,
    like the worker's real proposal, differs from the token the model chose)."""
    kept = len(sampled) - 1 if sampled else 0
    return [sampled[i] if i < kept else d for i, d in enumerate(scheduled)]  # type: ignore[index]


def _replay(sched: Any, audit: SchedulerAudit, out: Any, model_output: Any) -> None:
    """The worker's side of the batch whose output is back, in the worker's order: before the
    forward, the rows (from where the worker starts them, on the tokens it ran), then the
    post-processing of a spec-decode engine."""
    from mambafuzz.sim.engine.engine_core import in_flight_corrections
    from mambafuzz.sim.worker.worker_mirror import accepted_count, extend_truth

    at = next((i for i, b in enumerate(audit.in_flight) if b.out is out), None)
    if at is None:  # scheduled before the audit attached
        return
    batch = audit.in_flight[at]
    del audit.in_flight[:at + 1]  # the engine core applies batches oldest first: at is 0
    audit.replayed += 1
    mirror = audit.mirror
    mirror.before_forward(out)
    mirror.begin_step(out.num_scheduled_tokens)
    rejected = [b.rejected for b in batch.before if b.rejected]
    batch.before = []  # replayed: no batch needs them again (keeps the chain of batches short)
    correction = in_flight_corrections(rejected, out, set(out.preempted_req_ids or ())) if rejected else {}
    index, sampled = model_output.req_id_to_index, model_output.sampled_token_ids or []
    post = []
    for row in batch.rows:
        i = index.get(row.rid)
        tokens = list(sampled[i]) if i is not None and i < len(sampled) and sampled[i] else []
        start = row.start - correction.get(row.rid, 0)
        truth = extend_truth(row.truth, row.req)
        if row.load and start > 0:  # the connector put the state of the first `start` tokens there
            mirror.load(row.tables, start, truth.at(start))
        drafts = worker_drafts(row.drafts, tokens)
        mirror.run_row(row.rid, row.tables, start, row.n, drafts, truth, row.num_prompt_tokens, row.prefill_len)
        end = start + row.n - len(drafts)
        have = len(truth.tokens)
        if tokens and end <= have < end + len(tokens):  # tokens vLLM may trim at a stop still ran
            truth.append(tokens[have - end:])
        if drafts and tokens:
            batch.rejected[row.rid] = len(drafts) + 1 - len(tokens)
        if audit.spec_engine:  # post-processed after the forward, with these tables
            post.append((row, start, len(drafts), accepted_count(tokens)))
    for row, start, num_drafts, accepted in post:
        mirror.postprocess(row.rid, row.tables, start, row.n, num_drafts, accepted)


def _async_loads_done(sched: Any, audit: SchedulerAudit, model_output: Any) -> None:
    """An async connector load finished: its state lands before vLLM caches the blocks."""
    done = getattr(getattr(model_output, "kv_connector_output", None), "finished_recving", None) or ()
    for rid in done:
        req = sched.requests.get(rid)
        if rid not in audit.external_loads or req is None or req.num_computed_tokens <= 0:
            continue
        audit.external_loads.discard(rid)
        audit.mirror.load(_tables(sched, audit, rid), req.num_computed_tokens,
                          _truth(audit, req).at(req.num_computed_tokens))


def _after_update(sched: Any, audit: SchedulerAudit) -> None:
    audit.steps += 1
    for req in list(sched.requests.values()):  # tokens appended this step extend the truth
        if req.request_id in audit.truths:
            _learn(audit, req, _truth(audit, req))
    judge_blocks(sched, audit)
    _step_ended(sched, audit)
    if audit.steps % audit.every == 0:
        logger.info("step %d: %d mamba prefix-cache entries checked, %d poisoned", audit.steps, audit.checked,
                    audit.count)


def _step_ended(sched: Any, audit: SchedulerAudit) -> None:
    """An engine step may have ended (the next schedule() begins, or an output was applied): the
    publications still waiting for their writers count as published if cached now, as the
    harness counts the entries cached at the end of a step, even if a later step drops them."""
    if not audit.pending:
        return
    pool = sched.kv_cache_manager.block_pool
    cache = pool.cached_block_hash_to_block
    for p in audit.pending:
        if cache.contain(p.key, p.block_id):
            p.at_step_end = _claim(pool, p)


def _claim(pool: Any, p: _Pending) -> tuple[bool, int | None]:
    """(whether `p.key` is its block's primary key, the token count vLLM recorded for it then)."""
    block = pool.blocks[p.block_id]
    primary = block.block_hash == p.key
    return primary, block.block_hash_num_tokens if primary else None


def judge_blocks(sched: Any, audit: SchedulerAudit) -> None:
    """Judge the publications whose writers have been replayed (every batch scheduled by the
    time of the publication), each key once: those still cached, and those an engine step ended
    with (dropped since, while their writers were in flight), as they were then."""
    from mambafuzz.checks.oracle import holds_other_state, slot_hash_poisoned
    from mambafuzz.sim.bridge.vllm_compat.api import get_block_hash, get_group_id

    ready = audit.replayed
    pending = [p for p in audit.pending if p.after <= ready]
    if not pending:
        return
    audit.pending = [p for p in audit.pending if p.after > ready]
    pool = sched.kv_cache_manager.block_pool
    cache = pool.cached_block_hash_to_block
    seen: set[tuple[Any, int]] = set()
    for p in pending:
        gid = get_group_id(p.key)
        auditor = audit.auditors.get(gid)
        if auditor is None or (p.key, p.block_id) in seen:
            continue
        if cache.contain(p.key, p.block_id):
            primary, recorded = _claim(pool, p)
        elif p.at_step_end is not None:
            primary, recorded = p.at_step_end
        else:
            continue  # not a mamba group, or published and dropped again within the step
        seen.add((p.key, p.block_id))
        block_hash = bytes(get_block_hash(p.key))
        if not auditor.knows(block_hash):
            audit.unjudged += 1
            continue
        audit.checked += 1
        e = auditor.entry(block_hash, p.block_id, primary, recorded, True)
        if not slot_hash_poisoned(e):
            continue
        claimed, held = e.claimed.num_tokens, e.held.num_tokens
        bad = Poisoned(audit.steps, e.claimed_by, gid, e.column, p.block_id, claimed, held, held == claimed,
                       None if holds_other_state(e) else e.recorded_tokens)
        audit.poisoned.append(bad)
        logger.warning(bad.describe())
        if _COUNTER is not None:
            _COUNTER.inc()
