"""The mirror held against vLLM's own worker code, row by row (`mambafuzz conform`).

For every row the real scheduler schedules, mambafuzz/conform/drive.py asks vLLM's own worker
bookkeeping (V1's InputBatch + preprocess_mamba + the metadata builders, V2's
MambaHybridModelState, the fused copies under Triton's interpreter) what it does; this module
asks the kernel model (mambafuzz/sim/worker/kernel_model.py with mambafuzz/sim/worker/runners.py and mambafuzz/sim/worker/mixers.py) the same
question for the same runner and mixer family, and compares: the block the kernel reads its
initial state from (None: zeros), the blocks it writes, the pre-forward copies (source and
destination: a copy from the wrong column lands where it should and is read from there), the
destinations of the post-forward copies, and the internal-checkpoint block (Mamba2 only; Qwen's GDN mixer writes
none).  What it cannot compare is listed in docs/CONFORMANCE.md.

Two normalisations, both because the conformance tier sees copies by value: a copy of a block
onto itself is invisible there, so the mirror's self-copies are dropped; writes to the null
block (id 0) are dropped on vLLM's side, as the mirror drops them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from mambafuzz.conform import drive as conform_drive
from mambafuzz.conform.rows import StepInput
from mambafuzz.model import runners as model_runners
from mambafuzz.model.scenario import VOCAB_SIZE, EngineConfig, Scenario, ScenarioError, with_runner
from mambafuzz.sim.bridge import scheduler_session
from mambafuzz.sim.worker.kernel_model import KernelGeometry, KernelModel

MIXERS = ("gdn", "mamba2")
Observer = Callable[[str, StepInput], object]
Effect = tuple  # (read block | None, written blocks, pre-copies (src, dst), post-copy dsts, checkpoint blocks)


@dataclass(frozen=True)
class Disagreement:
    step: int
    runner: str
    mixer: str
    req_id: str
    kind: str  # the row kind vLLM's builder gave it
    row: object  # conform_rows.RowInput
    mirror: Effect
    vllm: Effect

    @property
    def key(self) -> tuple:
        """What makes two disagreements the same rule: runner, mixer, row kind, first chunk, drafts."""
        return (self.runner, self.mixer, self.kind, self.row.num_computed == 0, self.row.num_drafts > 0)

    def describe(self) -> str:
        return (f"step {self.step} {self.req_id} [{self.runner}/{self.mixer}, vLLM: {self.kind}] {self.row}\n"
                f"    mirror: {self.mirror}\n    vLLM:   {self.vllm}")


class _Recording(scheduler_session.SchedulerSession):
    """The driver's session, remembered so that the mirror gets the same geometry."""

    last: scheduler_session.SchedulerSession | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _Recording.last = self


def geometry(e: EngineConfig, hash_block_size: int, cache_hit_alignment_tokens: int, drop_eagle_block: bool = False,
             null_block_id: int = 0) -> KernelGeometry:
    """The kernel model's geometry for engine `e` with the scheduler's own derived sizes."""
    return KernelGeometry(
        block_size=e.mamba_block_size, hash_block_size=hash_block_size,
        checkpoint_alignment=e.prefill_checkpoint_alignment if e.num_prefill_checkpoint_blocks else None,
        cache_hit_alignment_tokens=cache_hit_alignment_tokens, drop_eagle_block=drop_eagle_block,
        null_block_id=null_block_id, vocab_size=VOCAB_SIZE, spec_engine=e.uses_spec_decode,
        num_speculative_tokens=e.num_speculative_tokens)


def _session_geometry(e: EngineConfig, session: scheduler_session.SchedulerSession) -> KernelGeometry:
    return geometry(e, session.hash_block_size, session.cache_hit_alignment_tokens,
                    bool(getattr(session.scheduler, "use_eagle_block_drop", False)), session.null_block_id)


def _mirror_effect(km: KernelModel, e: EngineConfig, r) -> Effect:
    bs = e.mamba_block_size
    table = list(r.block_ids)
    spec = e.uses_spec_decode
    curr = -(-(r.num_computed + r.num_scheduled) // bs) - 1
    running, accepted = km.worker_state(r.req_id)
    prev = (r.num_computed - 1) // bs if running is None else running
    src = prev + accepted - 1
    self_copy = prev != curr and 0 <= src < len(table) and table[src] == table[curr]
    spec_row = spec and km.is_spec_row(r.num_computed, r.num_scheduled, r.num_drafts, r.num_prompt_tokens)
    res = km.run_row(r.req_id, table, r.num_computed, [1] * r.num_scheduled, r.num_drafts, spec_row)
    src_block = table[src] if 0 <= src < len(table) else -1  # the column the copy reads, as the worker's table holds it
    pre = tuple(sorted((src_block, b) for _, b, _, cause in res.writes if cause == "precopy" and not self_copy))
    writes = tuple(sorted({b for _, b, _, cause in res.writes if cause not in ("precopy", "checkpoint")}))
    ckpt = tuple(sorted(b for _, b, _, cause in res.writes if cause == "checkpoint"))
    post: tuple = ()
    if spec:
        psrc = km.worker_state(r.req_id)[0]  # set by run_row above
        resolved = r.num_computed + r.num_scheduled - r.num_drafts
        aligned = (resolved + r.num_sampled - 1) // bs * bs
        pself = aligned >= resolved and table[psrc + aligned - resolved] == table[aligned // bs - 1]
        done = km.postprocess_spec(r.req_id, table, r.num_computed, r.num_scheduled, r.num_drafts, r.num_sampled)
        post = () if pself else tuple(sorted(b for _, b, _, _ in done))
    read = None if (not spec_row and r.num_computed == 0) else res.read_block
    return read, writes, pre, post, ckpt


def _vllm_effect(p, mirror_ckpt: tuple) -> Effect:
    ckpt = tuple(sorted(w.block for w in p.writes if w.cause == "checkpoint" and w.block > 0))
    return (p.read_block if p.has_initial_state else None,
            tuple(sorted({w.block for w in p.writes if w.cause != "checkpoint" and w.block > 0})),
            tuple(sorted(p.pre_copies)), tuple(sorted(d for _, d in p.post_copies)),
            ckpt if p.mixer == "mamba2" else mirror_ckpt)


def compare(s: Scenario, runners: tuple[str, ...] | None = None, observe: Observer | None = None) -> Iterator[Disagreement]:
    """Drive `s` through the real scheduler and yield every row where the mirror and vLLM's
    worker code differ, for each runner in `runners` (None: every registered one) and both mixer
    families.  Each runner is held against a scheduler built for it (`with_runner`: vLLM's
    scheduler hands V1 and V2 different outputs, e.g. resumed requests); a runner the scenario
    cannot run on (pipeline stages are V2's) is skipped, as a campaign on that runner skips it.
    `observe(runner, step_input)` sees each step compared (the row-class tally)."""
    runners = runners or model_runners.names()
    if len(runners) > 1 or s.engine.runner != runners[0]:
        for runner, own in per_runner(s, runners):
            if own is not None:
                yield from compare(own, (runner,), observe)
        return
    original = conform_drive.scheduler_session.SchedulerSession
    conform_drive.scheduler_session.SchedulerSession = _Recording
    try:
        steps = conform_drive.drive(s, runners)
        first = next(steps, None)  # the session exists once the first step has run
        if first is not None:
            g = _session_geometry(s.engine, _Recording.last)
            yield from compare_steps(s.engine, g, itertools.chain([first], steps), runners, observe)
    finally:
        conform_drive.scheduler_session.SchedulerSession = original


def per_runner(s: Scenario, runners: Iterable[str]) -> list[tuple[str, Scenario | None]]:
    """`s` as each runner runs it (`with_runner`), or None for a runner it cannot run on."""
    out: list[tuple[str, Scenario | None]] = []
    for runner in runners:
        try:
            out.append((runner, with_runner(s, runner)))
        except ScenarioError:
            out.append((runner, None))
    return out


def compare_steps(e: EngineConfig, g: KernelGeometry, steps: Iterable[conform_drive.ConformStep],
                  runners: tuple[str, ...] | None = None, observe: Observer | None = None) -> Iterator[Disagreement]:
    """The kernel model (geometry `g`) against the RowPlans of `steps`, whether the real
    scheduler made them (`compare`) or a test built them by hand; `runners` as for `compare`."""
    runners = runners or model_runners.names()
    models = {(r, m): KernelModel(g, runner=r, mixer=m) for r in runners for m in MIXERS}
    for st in steps:
        si = st.input
        plans = {(p.runner, p.mixer, p.req_id): p for p in st.plans}
        scheduled = {r.req_id for r in si.rows}
        for runner in runners if observe else ():
            observe(runner, si)
        for (runner, mixer), km in models.items():
            km.forget_requests(set(si.finished) | set(si.preempted) | set(si.resumed))
            km.begin_step(scheduled)
            km.begin_forward(len(si.rows))
            for r in si.rows:
                mirror = _mirror_effect(km, e, r)
                p = plans.get((runner, mixer, r.req_id))
                if p is None:
                    continue
                got = _vllm_effect(p, mirror[4])
                if got != mirror:
                    yield Disagreement(st.step, runner, mixer, r.req_id, p.kind, r, mirror, got)
