"""What a recurrent state *is* for the oracle: how many tokens it has absorbed and a
fingerprint of exactly those tokens.

A real SSM state is a lossy function of its input; ours is an exact one, so any state that
came from the wrong tokens, or from too few of them, is told apart from the right one.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import NamedTuple

_MASK = (1 << 64) - 1
_PRIME = 0x100000001B3


class State(NamedTuple):
    """Immutable and cheap: the harness builds several per scheduled row (a tuple's C-level
    construction, equality and hash, where a frozen dataclass's are Python-level)."""

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


_PROMPT_CHAINS: dict[Hashable, list[int]] = {}


class PrefixStates:
    """The true state after each prefix of one token sequence, extended as the sequence grows
    (prompt first, then sampled outputs).  Keeps only the fingerprint chain; `State`
    objects are built on demand (this is the harness's hottest loop)."""

    def __init__(self, tokens: list[int] | None = None):
        self._fps = [EMPTY.fingerprint]
        self._tokens: list[int] = []
        if tokens:
            self.append(tokens)

    @classmethod
    def for_prompt(cls, prompt: list[int], key: Hashable | None = None) -> PrefixStates:
        """Same as PrefixStates(prompt), reusing the chain computed for an identical prompt
        (each evaluation runs the same prompts with prefix caching on and off). `key`, when
        given, must determine the prompt (a cheaper dict key than the tokens themselves).
        Takes ownership of `prompt`."""
        key = tuple(prompt) if key is None else key
        chain = _PROMPT_CHAINS.get(key)
        if chain is None or len(chain) != len(prompt) + 1:
            chain = cls(prompt)._fps
            if len(_PROMPT_CHAINS) >= 32:  # bounded: only the cached/uncached pair needs it
                _PROMPT_CHAINS.pop(next(iter(_PROMPT_CHAINS)))
            _PROMPT_CHAINS[key] = chain
        states = cls()
        states._fps = list(chain)
        states._tokens = prompt
        return states

    def append(self, tokens: list[int]) -> None:
        fps = self._fps
        fp = fps[-1]
        for tok in tokens:
            fp = ((fp ^ (tok + 0x9E3779B9)) * _PRIME) & _MASK
            fps.append(fp)
        self._tokens += tokens

    def at(self, length: int) -> State:
        return State(length, self._fps[length])

    def span(self, start: State, begin: int, end: int) -> State:
        """`start.extend(self.tokens[begin:end])`: O(1) when `start` is this sequence's true state
        after `begin` tokens (the common case: a slot that holds what it should), else computed
        token by token. Same result either way."""
        fps = self._fps
        if start.num_tokens == begin and fps[begin] == start.fingerprint:
            return State(end, fps[end])
        return start.extend(self._tokens[begin:end])

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
