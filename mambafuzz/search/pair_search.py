"""The `pairs` generator's choices, apart from running anything: the next input (fresh random
bytes, or a byte-level mutation of a kept input), and which inputs to keep.

An input is kept when its run reached a state-coverage feature no earlier input reached: a
dimension or a pair of dimensions (mambafuzz.search.state_coverage). A kept input is picked as a
parent in proportion to the rarity of its features (the sum of 1/count over them, as libFuzzer's
Entropic weighs rare features), so inputs that reached a rare pair are mutated most. Inputs are
bytes decoded by the same decoder as libFuzzer's (mambafuzz.model.generate.BytesSource), so a kept
input replays from the corpus like any other. No vLLM here: the worker runs the inputs and reports
their features; bench/pair_coverage.py drives the same class.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

FRESH_SHARE = 0.3  # inputs drawn fresh (the random generator's distribution), the rest mutated
FRESH_LEN = (16, 256)  # bytes in a fresh input; draws past its end come from a PRNG the bytes seed
MAX_LEN = 4096  # as the libFuzzer generators' -max_len
POOL_LIMIT = 2000  # kept inputs; past it a new keep replaces the kept input with the most common features
REWEIGH_EVERY = 64  # observations between recomputing the parents' weights


@dataclass
class Kept:
    data: bytes
    features: frozenset


class PairSearch:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.counts: Counter = Counter()  # feature -> executions that reached it
        self.pool: list[Kept] = []
        self._weights: list[float] | None = None
        self._since = 0
        self.fresh = self.mutated = 0

    def next_input(self) -> bytes:
        """Fresh random bytes while nothing is kept and in FRESH_SHARE of draws, else a mutation of a parent."""
        rng = self.rng
        if not self.pool or rng.random() < FRESH_SHARE:
            self.fresh += 1
            return rng.randbytes(rng.randint(*FRESH_LEN))
        self.mutated += 1
        return mutate(self._parent().data, rng, self.pool)

    def observe(self, data: bytes, features: frozenset) -> bool:
        """Count an executed input's features; keep it when one is new. Returns whether it was kept."""
        new = any(f not in self.counts for f in features)
        self.counts.update(features)
        self._since += 1
        if self._since >= REWEIGH_EVERY:
            self._weights = None
        if not new:
            return False
        if len(self.pool) >= POOL_LIMIT:
            self.pool.pop(min(range(len(self.pool)), key=lambda i: self._rarity(self.pool[i])))
        self.pool.append(Kept(data, features))
        self._weights = None
        return True

    def _rarity(self, kept: Kept) -> float:
        counts = self.counts
        return sum(1.0 / counts[f] for f in kept.features if counts[f])

    def _parent(self) -> Kept:
        if self._weights is None:
            self._weights = [self._rarity(k) or 1e-9 for k in self.pool]
            self._since = 0
        return self.rng.choices(self.pool, weights=self._weights)[0]


def mutate(data: bytes, rng: random.Random, pool: Sequence[Kept] = ()) -> bytes:
    """One to three stacked byte-level changes (libFuzzer's havoc, reduced): overwrite, nudge,
    insert, erase, truncate, or splice with another kept input. Never empty, at most MAX_LEN."""
    out = bytearray(data or rng.randbytes(1))
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(6)
        n = len(out)
        at = rng.randrange(n)
        if op == 0:  # overwrite a few bytes
            for _ in range(rng.randint(1, 4)):
                out[rng.randrange(n)] = rng.randrange(256)
        elif op == 1:  # nudge one byte
            out[at] = (out[at] + rng.choice((-1, 1))) % 256
        elif op == 2:  # insert random bytes
            out[at:at] = rng.randbytes(rng.randint(1, 8))
        elif op == 3 and n > 1:  # erase a range
            del out[at:at + rng.randint(1, min(8, n - 1))]
        elif op == 4 and n > 1:  # truncate: the draws past the end come from the PRNG
            del out[rng.randint(1, n - 1):]
        elif op == 5 and pool:  # splice: this input's head, another's tail
            other = rng.choice(pool).data
            out = out[:at] + other[rng.randrange(len(other) or 1):]
        if not out:
            out = bytearray(rng.randbytes(1))
    return bytes(out[:MAX_LEN])
