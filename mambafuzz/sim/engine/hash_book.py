"""Which exact tokens each block hash stands for: hash -> (request, true state).

Block hashes chain over token ids, so the request that first produced a hash tells us exactly
which state any block published under that hash must hold.  The harness's cache audit and the
runtime audit plugin both judge published mamba blocks against this one book.  (No vLLM import:
the audit plugin loads it inside a serving vLLM process.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class HashBook:
    def __init__(self, hash_block_size: int, limit: int | None = None):
        """`limit`: at most this many hashes (the oldest half is dropped past it), for a
        long-lived process; entries are judged within a step of being learned."""
        self.unit = hash_block_size
        self.limit = limit
        self.truth: dict[bytes, tuple[str, Any]] = {}
        # per request, how many of its hashes `learn` has gone through: while a request has no more
        # hashes than this, `learn` changes nothing (a caller on a hot path may skip the call)
        self.learned: dict[str, int] = {}

    def learn(self, rid: str, hashes: Sequence[bytes], truth: Any) -> None:
        """Record the hashes of `rid` not seen yet whose tokens `truth` (PrefixStates) covers."""
        start = self.learned.get(rid, 0)
        end = min(len(hashes), len(truth.tokens) // self.unit)
        if end <= start:
            return
        book, unit = self.truth, self.unit
        for i in range(start, end):
            key = bytes(hashes[i])
            if key not in book:  # the first request to produce a hash names it; later ones build nothing
                book[key] = (rid, truth.at((i + 1) * unit))
        self.learned[rid] = end
        if self.limit is not None and len(self.truth) > self.limit:
            for key in list(self.truth)[: self.limit // 2]:
                del self.truth[key]

    def forget(self, rid: str) -> None:
        """`rid` finished: its hashes stay, its progress is dropped."""
        self.learned.pop(rid, None)

    def claim(self, block_hash: bytes) -> tuple[str, Any] | None:
        """(request that defined it, the state it stands for), or None for a hash never seen."""
        return self.truth.get(block_hash)
