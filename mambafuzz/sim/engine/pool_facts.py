"""The resource facts a run's trace keeps after each engine step, for the resource oracles
(mambafuzz.checks.resources): the pool's accounting, the blocks in use at the peak, allocations
over vLLM's estimate, LRU evictions, and the blocks of a request that holds the pool alone (the
capacity vLLM promised at start-up); and, as vLLM frees a request, the keys of its cached
attention blocks (`attention_key`)."""

from __future__ import annotations

from typing import Any

from mambafuzz.sim.trace import Trace

POOL_WALK_EVERY_STEP = 4096  # blocks: the largest pool whose accounting is walked after every step


class PoolFacts:
    def __init__(self, session: Any, trace: Trace):
        self.session = session
        self.trace = trace
        self._walked_free: int | None = None  # the free count at the pool's last walk
        # bound once, read after every step: the free count, the lone holder, and the session's lists
        # of allocations over vLLM's estimate and LRU evictions (cleared in place, so the same lists)
        self._free_count = session.num_free_blocks
        self._lone_holding = session.lone_holding
        self._over_estimates = session.over_estimates
        self._evictions = session.lru_evictions
        self._walk_on_move = trace.num_blocks <= POOL_WALK_EVERY_STEP
        steps, keys = trace.steps, trace.attention_keys

        def wrong_key(request: str, group: int, column: int, block: int, what: str) -> None:
            keys.append((len(steps) - 1, request, group, column, block, what))  # the step running

        session.watch_frees(wrong_key)  # checked as vLLM frees a request: nothing per step

    def step(self, step: int) -> None:
        """The step's resource facts: the pool's accounting, the blocks in use, LRU evictions, and
        the blocks of a request that holds blocks alone (the capacity vLLM promised at start-up)."""
        trace = self.trace
        # The pool's accounting walks every block: every 8th step, at the end of a run (`run`), and, on pools of
        # up to POOL_WALK_EVERY_STEP blocks (the generators' pools, mostly), after each step that moved the free
        # count. Most steps leave it as it was (85% of generated ones: decodes inside a block). A fault in the
        # counts stays until a block is taken or freed again (an unqueued zero count, a negative one, a queue
        # counter off), so the next walk sees it, at most 7 steps later; one that a later step undoes while the
        # free count stands still is not seen.
        free = self._free_count()
        if not step % 8 or (free != self._walked_free and self._walk_on_move):
            free = self._walked_free = self.walk(step)
        used = trace.num_blocks - 1 - free  # the null block is never free, and holds nothing
        if used > trace.peak_blocks:
            trace.peak_blocks = used
        over = self._over_estimates
        if over:  # allocations that took more blocks than vLLM checked for
            trace.over_estimates += [(step, *o) for o in over]
            over.clear()
        evictions = self._evictions
        if evictions is not None and evictions[0]:
            trace.lru_evictions[step] = evictions[0]
            evictions[0] = 0
        lone = self._lone_holding()
        if lone is not None:
            # alone only when its tables hold every block in use: blocks vLLM holds back for a freed request
            # (`Scheduler.deferred_frees`, with a consumer connector and batches in flight) belong to no table
            if sum(lone[1]) == used:
                trace.alone.append((step, *lone))

    def walk(self, step: int) -> int:
        """Record the pool's accounting after `step` (`SchedulerSession.walk_pool`); returns its free count."""
        counts, mismatch = self.session.walk_pool()
        self.trace.pool.append((step, *counts))
        if mismatch is not None:
            self.trace.ref_mismatches[step] = mismatch
        return counts[0]
