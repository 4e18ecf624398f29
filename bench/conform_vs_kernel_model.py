"""Scratch adapter: hold fuzz/kernel_model.py's bookkeeping against vLLM's own (fuzz/conform_drive.py).

Run:  python bench/conform_vs_kernel_model.py [--seconds S] [--seed N] [FILE.json ...]

For every scheduled row of the given scenario files, then of random scenarios for --seconds, it
compares, per runner (v1, v2) and mixer (gdn, mamba2): the block the kernel reads its initial state
from (None: zeros), the blocks it writes, the destinations of the pre- and post-forward copies,
and the internal checkpoint block (Mamba2 only; Qwen's GDN mixer writes none). It prints the first
row of each kind of disagreement and a count per kind.

Two normalisations, both because vLLM's copies are observed by value (conform_vllm.py): a copy of a
block onto itself is invisible there, so the kernel model's self-copies are dropped; and writes to
the null block (id 0) are dropped on vLLM's side, as the kernel model drops them.

Written against the kernel model of commit e20579b (it reads `_prev_column`/`_num_accepted` to spot
self-copies); the per-runner rewrite (fuzz/runners.py) needs its own adapter.
"""

from __future__ import annotations

import argparse
import collections
import random
import time

from fuzz import conform_drive as cd
from fuzz import vllm_bridge as vb
from fuzz.corpus import load_case
from fuzz.generate import random_scenario
from fuzz.kernel_model import KernelGeometry, KernelModel
from fuzz.scenario import VOCAB_SIZE, Scenario, validate

Effect = tuple


class _Recording(vb.SchedulerSession):
    """The driver's session, remembered so the kernel model gets the same geometry."""

    last: vb.SchedulerSession | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _Recording.last = self


def _mirror(s: Scenario, session: vb.SchedulerSession) -> KernelModel:
    e, sched = s.engine, session.scheduler
    manager = sched.kv_cache_manager.coordinator.single_type_managers[session.mamba_group]
    return KernelModel(KernelGeometry(
        block_size=e.mamba_block_size, hash_block_size=session.hash_block_size,
        checkpoint_alignment=e.prefill_checkpoint_alignment if e.num_prefill_checkpoint_blocks else None,
        cache_hit_alignment_tokens=manager.cache_hit_alignment_tokens,
        drop_eagle_block=bool(getattr(sched, "use_eagle_block_drop", False)),
        null_block_id=session.null_block_id, vocab_size=VOCAB_SIZE))


def _mirror_effect(km: KernelModel, s: Scenario, r) -> Effect:
    bs = s.engine.mamba_block_size
    table = list(r.block_ids)
    spec = s.engine.uses_spec_decode
    curr = -(-(r.num_computed + r.num_scheduled) // bs) - 1
    prev = km._prev_column.get(r.req_id, (r.num_computed - 1) // bs)
    src = prev + km._num_accepted.get(r.req_id, 1) - 1
    self_copy = prev != curr and 0 <= src < len(table) and table[src] == table[curr]
    spec_row = km.is_spec_row(spec, r.num_computed, r.num_scheduled, r.num_drafts, r.num_prompt_tokens)
    res = km.run_row(r.req_id, table, r.num_computed, [1] * r.num_scheduled, r.num_drafts, spec_row)
    pre = tuple(sorted(b for _, b, _, cause in res.writes if cause == "precopy" and not self_copy))
    writes = tuple(sorted({b for _, b, _, cause in res.writes if cause not in ("precopy", "checkpoint")}))
    ckpt = tuple(sorted(b for _, b, _, cause in res.writes if cause == "checkpoint"))
    post: tuple = ()
    if spec:
        psrc = km._prev_column[r.req_id]
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
            tuple(sorted({w.block for w in p.writes if w.cause != "checkpoint"})),
            tuple(sorted(d for _, d in p.pre_copies)), tuple(sorted(d for _, d in p.post_copies)),
            ckpt if p.mixer == "mamba2" else mirror_ckpt)


def compare(s: Scenario, tag: str, seen: collections.Counter) -> None:
    km = None
    for st in cd.drive(s):
        if km is None:
            km = _mirror(s, _Recording.last)
        si = st.input
        km.forget_requests(set(si.finished) | set(si.preempted) | set(si.resumed))
        plans = {(p.runner, p.mixer, p.req_id): p for p in st.plans}
        for r in si.rows:
            mirror = _mirror_effect(km, s, r)
            for (runner, mixer, rid), p in plans.items():
                if rid != r.req_id or (got := _vllm_effect(p, mirror[4])) == mirror:
                    continue
                kind = (runner, mixer, p.kind, r.num_computed == 0, r.num_drafts > 0)
                seen[kind] += 1
                if seen[kind] == 1:
                    print(f"{kind} {tag} step {st.step} {r}\n  kernel model {mirror}\n  vLLM         {got}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    cd.vb.SchedulerSession = _Recording
    seen: collections.Counter = collections.Counter()
    for path in args.files:
        compare(load_case(path).scenario, path.rsplit("/", 1)[-1], seen)
    rng, ran = random.Random(args.seed), 0
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        s = random_scenario(rng)
        if validate(s):
            continue
        try:
            compare(s, f"random#{ran}", seen)
            ran += 1
        except vb.ConfigRejected:
            continue
    print(f"{len(args.files)} files + {ran} random scenarios; disagreements by kind: {dict(seen)}")


if __name__ == "__main__":
    main()
