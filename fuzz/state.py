"""What a recurrent state *is* for the oracle: how many tokens it has absorbed and a
fingerprint of exactly those tokens.

A real SSM state is a lossy function of its input; ours is an exact one, so any state that
came from the wrong tokens, or from too few of them, is told apart from the right one.
"""

from __future__ import annotations

from dataclasses import dataclass

_MASK = (1 << 64) - 1
_PRIME = 0x100000001B3


@dataclass(frozen=True, slots=True)
class State:
    num_tokens: int
    fingerprint: int

    def extend(self, tokens: list[int]) -> State:
        fp = self.fingerprint
        for tok in tokens:
            fp = ((fp ^ (tok + 0x9E3779B9)) * _PRIME) & _MASK
        return State(self.num_tokens + len(tokens), fp)

    def __str__(self) -> str:
        return f"state@{self.num_tokens}#{self.fingerprint & 0xFFFF:04x}"


EMPTY = State(0, 0xCBF29CE484222325)


class PrefixStates:
    """The true state after each prefix of one token sequence, extended lazily as the
    sequence grows (prompt first, then sampled outputs)."""

    def __init__(self, tokens: list[int] | None = None):
        self._states = [EMPTY]
        self._tokens: list[int] = []
        if tokens:
            self.append(tokens)

    def append(self, tokens: list[int]) -> None:
        state = self._states[-1]
        for tok in tokens:
            state = state.extend([tok])
            self._states.append(state)
        self._tokens += tokens

    def truncate(self, length: int) -> None:
        """Forget tokens past `length` (rejected draft tokens are never part of the truth)."""
        del self._states[length + 1 :]
        del self._tokens[length:]

    def at(self, length: int) -> State:
        return self._states[length]

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> list[int]:
        return self._tokens


def next_token(state: State, vocab_size: int) -> int:
    """The simulated model's greedy output: a pure function of the state it runs from,
    so a wrong state changes what the request generates."""
    mixed = (state.fingerprint ^ (state.num_tokens * 0x9E3779B97F4A7C15)) & _MASK
    mixed = ((mixed ^ (mixed >> 29)) * 0xBF58476D1CE4E5B9) & _MASK
    return 1 + (mixed ^ (mixed >> 32)) % (vocab_size - 1)
