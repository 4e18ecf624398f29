"""The harness's audit of the prefix cache, step by step: which published mamba blocks to judge
again (`cache_audit.BlockAuditor` describes each). A key's claim never changes and a block's
held state changes only by a write, so an entry judged once keeps its verdict until its block is
written or the key map changes; the scan is redone only then, and only in part while keys are
only added. `check_view` holds that shortcut to the cache at the end of a run."""

from __future__ import annotations

from typing import Any

from mambafuzz.sim.bridge import scheduler_session
from mambafuzz.sim.engine.cache_audit import BlockAuditor
from mambafuzz.sim.engine.worker_contract import HarnessError
from mambafuzz.sim.trace import StepRecord, Trace


class CacheScan:
    """One run's cache audit: `step` after each engine step records the entries whose verdict may
    have changed in the step's record."""

    def __init__(self, session: Any, auditor: BlockAuditor, trace: Trace):
        self.session = session
        self.auditor = auditor
        self.trace = trace
        self.known_entries: set[tuple[bytes, int]] = set()
        # the last full scan of the cache's mamba keys, and the key-map version it saw
        self._scanned: list = []
        self._scanned_blocks: set[int] = set()
        self._scanned_version = -1

    def step(self, rec: StepRecord) -> None:
        """Record the mamba cache entries whose verdict may have changed this step: new keys, and
        keys on blocks the kernel model wrote. A key's claim never changes and a block's held state
        changes only by a write, so an entry judged before keeps its verdict until one of these.
        While no key was added or removed, the last scan's entries (all judged) still hold; while keys
        were only added, each new to the map, a scan would yield the last scan's entries and then
        theirs (SchedulerSession.take_added_mamba_keys), so the scan is not redone."""
        model = self.auditor.model
        written = model.dirty  # `take_dirty`, inline: the blocks written since the last step
        if written:
            model.dirty = set()
        version = self.session.cache_keys_version()
        if version == self._scanned_version:
            if not written or written.isdisjoint(self._scanned_blocks):
                return
            changed = [(key, block) for key, block in self._scanned if block.block_id in written]
            self._describe(rec, changed, self.known_entries)
            return
        added = self.session.take_added_mamba_keys()
        if added is not None:
            known = self.known_entries
            changed = ([(key, block) for key, block in self._scanned if block.block_id in written]
                       if written and not written.isdisjoint(self._scanned_blocks) else [])
            self._describe(rec, changed + added, known)  # the new keys' entries are not in `known`: new
            self._scanned += added
            known.update([(key, block.block_id) for key, block in added])
            self._scanned_blocks.update([block.block_id for _, block in added])
            self._scanned_version = version
            return
        scanned = list(self.session.cached_mamba_blocks())
        seen = {(key, block.block_id) for key, block in scanned}
        known = self.known_entries
        self._describe(rec, [(key, block) for key, block in scanned
                             if (key, block.block_id) not in known or block.block_id in written], known)
        self.known_entries = seen
        self._scanned, self._scanned_version = scanned, version
        self._scanned_blocks = {block.block_id for _, block in scanned}

    def after_reset(self, mamba_keys_left: set[tuple[bytes, int]] | frozenset[tuple[bytes, int]]) -> None:
        """The engine reset the prefix cache: the entries still in it (none, when the reset emptied it) are
        the only ones known, so an entry keyed after the reset is new even on a pair keyed before it. The
        session forces the next scan to be a full one (SchedulerSession.reset_prefix_cache)."""
        self.known_entries = set(mamba_keys_left)
        self._scanned, self._scanned_blocks, self._scanned_version = [], set(), -1

    def check_view(self) -> None:
        """Tripwire for the incremental audit: at the end of a run the cache's mamba keys must be
        the ones the last scan saw, unless the change counter says they moved since. If not,
        this vLLM changes its prefix cache in a way the bridge does not count, and the audit
        would miss entries: a tool failure, not a clean run."""
        if self.session.cache_keys_version() != self._scanned_version:
            return
        actual = {(key, block.block_id) for key, block in self.session.cached_mamba_blocks()}
        if actual != self.known_entries:
            raise HarnessError(f"the cache audit saw {len(self.known_entries)} mamba cache entries but the cache "
                               f"holds {len(actual)}: this vLLM changes its prefix cache in a way "
                               "SchedulerSession.cache_keys_version does not count")

    def _describe(self, rec: StepRecord, pairs: list, known: set[tuple[bytes, int]]) -> None:
        """Append a cache entry per (key, block) in `pairs`; those not in `known` are new."""
        describe = self.auditor.entry
        for key, block in pairs:
            new = (key, block.block_id) not in known
            entry = scheduler_session.SchedulerSession.mamba_entry(key, block)
            if new:
                self.trace.hashed_snapshots += 1
            rec.add("cache", describe(entry.block_hash, entry.block_id, entry.primary, entry.claimed_tokens, new))
