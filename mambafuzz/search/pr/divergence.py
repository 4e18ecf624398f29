"""Where two runs of one scenario first part: the PR's vLLM against its base's.

A finding of the PR job fails on the PR and is clean on its base, so the two runs of its
minimized case differ, and the first place they do is the code change's first visible effect:
which scheduler or KV-cache-manager output (a hit length, a chunk's token count, a block id, a
published hash) it moved first, and on what kind of row. That place depends on the change, not
on the symptom the oracles saw many steps later, so it tells apart two bugs that end in the same
symptom (mambafuzz.search.pr.grouping). `observed` is what one run shows, in a form that crosses a
process boundary (the base runs in another process, mambafuzz.search.pr.base_process); `first_difference`
compares two of them.
"""

from __future__ import annotations

from mambafuzz.sim.trace import Chunk, Trace

# What a step shows, in the order vLLM produces it: admission (the hit found), the rows scheduled
# (SchedulerOutput's num_computed/num_scheduled tokens and the block each row reads), the kernel
# model's writes into blocks, the hashes published, then who was preempted and who finished.
ROW_FIELDS = ("num_computed_tokens", "num_scheduled_tokens", "num_drafts", "read_column", "read_block")


def _row_kind(c: Chunk, prompt_len: int) -> str:
    if c.num_drafts:
        return "spec"
    if c.start >= prompt_len:
        return "decode"
    if c.first_after_admission:
        return "hit" if c.resumed_from_hit else "first"
    return "prefill"


def observed(trace: Trace) -> dict:
    """`trace`'s scheduler and KV-cache-manager outputs, step by step, as JSON-able lists (the
    kernel model's states are left out: they follow from these)."""
    steps = []
    for s in trace.steps:
        steps.append({
            "step": s.step,
            "admission": sorted([a.request_id, a.local_hit_tokens, a.external_tokens] for a in s.admissions),
            "rows": sorted([c.request_id, _row_kind(c, trace.prompt_lens.get(c.request_id, 0)), c.start, c.num_tokens,
                            c.num_drafts, c.read_column, c.read_block] for c in s.chunks),
            "writes": sorted([w.request_id, w.cause, w.column, w.block_id] for w in s.writes),
            "published": sorted([e.claimed_by, "primary" if e.primary else "other", e.column, e.block_id,
                                 -1 if e.recorded_tokens is None else e.recorded_tokens] for e in s.cache if e.new),
            "preempted": sorted(s.preempted),
            "finished": sorted(s.finished),
        })
    crash = trace.crash
    return {"steps": steps,
            "crash": None if crash is None else f"{crash.exc_type}@{crash.vllm_frame.rsplit(' in ', 1)[-1]}"}


# Per list, the name of each entry's fields after the first (the request) and the kind (second).
_NAMES = {"admission": ("local_hit_tokens", "external_tokens"),
          "rows": ROW_FIELDS,
          "writes": ("column", "block_id"),
          "published": ("column", "block_id", "recorded_tokens")}


def _by_key(name: str, entries: list) -> dict[tuple, list]:
    out: dict[tuple, list] = {}
    for e in entries:
        out.setdefault(tuple(e[:1] if name == "admission" else e[:2]), []).append(e)
    return out


def _first_in_list(name: str, pr: list, base: list) -> tuple[str, str] | None:
    """(row kind, field) of the first difference between one step's entries of one list in two runs."""
    if pr == base:
        return None
    if name in ("preempted", "finished"):
        return name, f"{name}.requests"
    offset = 1 if name == "admission" else 2
    keyed_pr, keyed_base = _by_key(name, pr), _by_key(name, base)
    for key in sorted(keyed_pr.keys() & keyed_base.keys()):
        kind = "admission" if name == "admission" else key[1]
        for a, b in zip(keyed_pr[key], keyed_base[key]):
            for field, x, y in zip(_NAMES[name], a[offset:], b[offset:]):
                if x != y:
                    return kind, f"{name}.{field}"
        if len(keyed_pr[key]) != len(keyed_base[key]):
            return kind, f"{name}.{'more' if len(keyed_pr[key]) > len(keyed_base[key]) else 'fewer'}"
    only = sorted(keyed_pr.keys() ^ keyed_base.keys())
    kind = "admission" if name == "admission" else only[0][1]
    if name == "rows" and {k[0] for k in keyed_pr} == {k[0] for k in keyed_base}:
        return kind, "rows.kind"  # the same requests scheduled, one as another kind of row
    return kind, f"{name}.{'more' if len(pr) > len(base) else 'fewer'}"


def first_difference(pr: dict, base: dict) -> tuple[int, str, str] | None:
    """(step, row kind, field) where `pr`'s run first shows something `base`'s does not, None
    when the two show the same."""
    for a, b in zip(pr["steps"], base["steps"]):
        for name in ("admission", "rows", "writes", "published", "preempted", "finished"):
            found = _first_in_list(name, a[name], b[name])
            if found is not None:
                return a["step"], *found
    n = min(len(pr["steps"]), len(base["steps"]))
    if pr["crash"] != base["crash"]:
        return n, "crash", pr["crash"] or "none"
    if len(pr["steps"]) != len(base["steps"]):
        return n, "end", "steps.more" if len(pr["steps"]) > len(base["steps"]) else "steps.fewer"
    return None


SAME_OUTPUTS = "same-outputs"  # the two runs scheduled alike; only what some block holds differs


def key(pr: dict, base: dict) -> str:
    """The divergence key grouping compares: the output field (e.g. `rows.num_scheduled_tokens`,
    `admission.local_hit_tokens`, `rows.read_block`) the PR's run first shows differently. Not the
    step (one bug moves it with the case) nor the row kind (measured: it split one planted bug's
    findings into up to 6 keys without keeping two bugs' apart any better, bench/RESULTS.md)."""
    found = first_difference(pr, base)
    return SAME_OUTPUTS if found is None else found[2]
