"""A deliberately unreliable split for testing flaky-finding handling: each new scheduler
instance flips a (seeded) coin to behave like `prefix` or like the installed split."""

import random

from mambafuzz.sim.engine.splits import prefix_split

_rng = random.Random(3)
_choice: dict[int, bool] = {}


def split(self, request, num_new_tokens, num_new_local_computed_tokens=0, num_external_computed_tokens=0):
    key = id(self)
    if key not in _choice:
        _choice[key] = _rng.random() < 0.5
    if _choice[key]:
        return prefix_split(self, request, num_new_tokens, num_new_local_computed_tokens, num_external_computed_tokens)
    return type(self)._mamba_block_aligned_split(self, request, num_new_tokens, num_new_local_computed_tokens,
                                                 num_external_computed_tokens)
