"""What each attention block holds, for judging the attention blocks a prefix-cache hit serves.

The kernel model tracks the mamba states; a hybrid model's prefix hit also serves its attention
groups' KV blocks, and nothing judged those. A K/V vector at position p is a function of tokens
0..p, so an attention block of a group with block size B at column c, once every position in it is
written for a sequence, holds what that sequence's first (c+1)*B tokens determine: the same
fingerprint as the true state after them (mambafuzz.sim.state). A prefix-cache hit serves block c
as that; a block published before its tokens were computed (vLLM keys full blocks in
`allocate_slots`, before the forward: kv_cache_manager.py:606-616) and never computed after holds
something else, and a hit that serves it reads KV the scheduler never wrote.

Writes follow the worker: a scheduled row writes K/V for its tokens into the blocks
SchedulerOutput told it (the harness's worker_tables.WorkerTables, whose side groups are the
attention groups: one pass over each output keeps both), real tokens and
accepted drafts alike; a connector load writes the loaded positions into the blocks the scheduler
named to it. A block's content is recorded when the request's correct positions reach its end;
what a row writes into a block it does not complete is not tracked (a later row, or the same
request's next row after a rejection, completes it).
"""

from __future__ import annotations

from collections.abc import Sequence

from mambafuzz.sim.state import PrefixStates
from mambafuzz.sim.trace import Trace
from mambafuzz.sim.worker.worker_tables import WorkerTables


class AttentionBlocks:
    """One run's attention-block contents (block id -> fingerprint of the prefix it holds)."""

    def __init__(self, told: WorkerTables, block_sizes: Sequence[int], null_block: int, trace: Trace):
        self.groups = told.side_groups  # the attention KV-cache groups, in group order
        self.block_sizes = tuple(block_sizes[g] for g in self.groups)
        self.finest = min(self.block_sizes)  # a row that crosses no multiple of it completes no block
        self.told = told  # the worker's tables, which the harness updates from each SchedulerOutput
        self.null = null_block
        self.trace = trace
        self.content: dict[int, int] = {}  # block id -> fingerprint of the prefix its K/V hold

    def written(self, rid: str, start: int, end: int, truth: PrefixStates, beyond: Sequence[int] = (),
                tables: Sequence[list[int]] | None = None) -> None:
        """`rid`'s correct K/V now covers positions [start, end + len(beyond)) of its sequence:
        `truth` up to `end`, then `beyond` (drafts the row's sampler accepted, which `truth` may not
        hold yet), in its told tables (or `tables`, one list per attention group: the blocks a
        connector load wrote)."""
        if tables is None:
            tables = self.told.get_side(rid)
            if tables is None:
                return
        stop = end + len(beyond)
        known = len(truth)
        content, null = self.content, self.null
        for table, bs in zip(tables, self.block_sizes):
            for c in range(start // bs, min(stop // bs, len(table))):
                block = table[c]
                if block != null:
                    n = (c + 1) * bs
                    content[block] = (truth.at(n) if n <= known else
                                      truth.at(known).extend(list(beyond[known - end:n - end]))).fingerprint

    def judge_hit(self, step: int, rid: str, hit_tokens: int, truth: PrefixStates) -> None:
        """A prefix-cache hit of `hit_tokens` served to `rid`: every full attention block inside it
        must hold the K/V of `rid`'s own prefix up to that block's end. The first miss goes to the
        trace as (step, request, group, column, block, tokens the block claims, whether any sequence's
        K/V ever completed the block)."""
        tables = self.told.get_side(rid)
        if tables is None or not hit_tokens:
            return
        content, null = self.content, self.null
        for g, table, bs in zip(self.groups, tables, self.block_sizes):
            for c in range(min(hit_tokens // bs, len(table))):
                block = table[c]
                held = content.get(block)
                if block != null and held != truth.at((c + 1) * bs).fingerprint:
                    self.trace.attention_stale_hits.append((step, rid, g, c, block, (c + 1) * bs, held is not None))
                    return
