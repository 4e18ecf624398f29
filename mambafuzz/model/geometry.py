"""One scenario on smaller blocks: every token length scaled by the mamba block's ratio.

Align mode cuts chunks and publishes states on grids of the block sizes, so a case that fails
because a chunk ends one and a half mamba blocks in fails the same way on 8-token blocks as on
400-token ones. The minimizer moves each finding to the smallest geometry that keeps its
signature (mambafuzz.search.minimizer); findings of one root cause then share a geometry, and
one's case replays under the other's engine config (mambafuzz.search.pr.grouping). Which fields are
lengths is declared where they are defined: `Knob.length` on engine knobs, `{"length": True}`
metadata on RequestSpec fields, and the prefix segments. Step indexes, output counts
(`max_tokens`: one decode step each), drafts and block counts are left as they are.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

from mambafuzz.model.scenario import RequestSpec, Scenario, knobs

SMALLEST_MAMBA_BLOCK = 8  # validate(): a multiple of 8 (causal_conv1d alignment)


@functools.cache
def request_lengths() -> tuple[str, ...]:
    """The RequestSpec fields declared as token lengths."""
    return tuple(f.name for f in dataclasses.fields(RequestSpec) if f.metadata.get("length"))


def _scale(value: int, new: int, old: int, lo: int) -> int:
    """`value * new / old` rounded to the nearest integer (halves up); zero stays zero (it means
    "off" or "none"), anything else stays at least max(`lo`, 1)."""
    if not value:
        return value
    return max(lo, 1, (2 * value * new + old) // (2 * old))


def scaled(s: Scenario, mamba_block_size: int) -> Scenario:
    """A copy of `s` with mamba block `mamba_block_size` and every declared length scaled by the
    same ratio. It may be invalid (a grid that no longer divides): the caller validates."""
    old = s.engine.mamba_block_size
    c = copy.deepcopy(s)
    for name, k in knobs().items():
        value = getattr(c.engine, name)
        if k.length and value is not None:
            setattr(c.engine, name, _scale(value, mamba_block_size, old, k.lo))
    c.engine.mamba_block_size = mamba_block_size
    c.prefixes = [_scale(n, mamba_block_size, old, 1) for n in c.prefixes]
    for r in c.requests:
        for name in request_lengths():
            setattr(r, name, _scale(getattr(r, name), mamba_block_size, old, 0))
    return c


def smaller_blocks(mamba_block_size: int) -> list[int]:
    """Mamba block sizes to try below `mamba_block_size`, smallest first: 8 doubled up to it, and
    its half when that is a multiple of 8."""
    out = []
    size = SMALLEST_MAMBA_BLOCK
    while size < mamba_block_size:
        out.append(size)
        size *= 2
    half = mamba_block_size // 2
    if half % SMALLEST_MAMBA_BLOCK == 0 and half not in out and half >= SMALLEST_MAMBA_BLOCK:
        out.append(half)
    return sorted(out)
