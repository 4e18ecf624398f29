"""The one check of a published mamba block: does it hold the state its hash claims?

hash book + kernel model -> (this module) -> CacheEntry.  The harness records the entries in
its trace for the oracle; the runtime audit plugin judges them on the spot.  Both judge with
`mambafuzz.checks.oracle.slot_hash_poisoned`, the predicate of the `slot_hash` finding, so "poisoned"
means the same thing in a simulated run and a live engine.  (No vLLM import: the audit plugin
loads it inside a serving vLLM process.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mambafuzz.sim.state import State
from mambafuzz.sim.trace import CacheEntry

if TYPE_CHECKING:
    from mambafuzz.sim.engine.hash_book import HashBook
    from mambafuzz.sim.worker.kernel_model import KernelModel

_tuple_new = tuple.__new__

# A hash no request's tokens define: its claim is a state no block can hold.
UNKNOWN_CLAIM = ("?", State(-3, 0))


class BlockAuditor:
    """Describes published blocks of one mamba group: what each key claims, what the block holds."""

    __slots__ = ("book", "model", "block_size")

    def __init__(self, book: HashBook, model: KernelModel, block_size: int):
        self.book = book
        self.model = model
        self.block_size = block_size

    def knows(self, block_hash: bytes) -> bool:
        return self.book.claim(block_hash) is not None

    def entry(self, block_hash: bytes, block_id: int, primary: bool, recorded_tokens: int | None,
              new: bool) -> CacheEntry:
        """The key `block_hash` (group id stripped) on `block_id`; `primary`: the block's own key,
        whose `block_hash_num_tokens` is `recorded_tokens`."""
        owner, claimed = self.book.claim(block_hash) or UNKNOWN_CLAIM
        column = -(-claimed.num_tokens // self.block_size) - 1
        # tuple.__new__ builds the NamedTuple without its constructor's Python frame
        return _tuple_new(CacheEntry, (block_id, column, claimed, self.model.state_of(block_id), owner, new, primary,
                                       recorded_tokens))
