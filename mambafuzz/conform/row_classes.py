"""The row classes vLLM's worker code branches on, named from what the worker is told (a
`StepInput`), never from what vLLM's builders decided: a builder that misclassifies a row must
not change the class the row is counted in.

Where each class is a branch (vLLM 0.32):
- `gdn_attn.py` `GDNAttentionMetadataBuilder.build`: rows with `num_decode_draft_tokens >= 0` take
  the spec path (a decode that got no drafts too: V1 `gpu_model_runner.py` marks it 0, V2
  `mamba_hybrid.py` `prepare_attn` likewise); a batch with no spec rows takes the plain path;
  decodes and spec decodes in one batch turn the decodes into prefills.
- `mamba_attn.py` `_compute_common_metadata`: a one-token prefill chunk with prior state runs as a
  decode; a first chunk (no prior state) stays a prefill; a prompt tail padded with placeholder
  drafts runs as a spec decode; `has_initial_states_p` is whether a prefill row has prior state.
  GDN's one-token non-spec rows are decodes unless a spec row shares the batch, then prefills.
- V2 `mamba_hybrid.py`: `prefill_runs_as_decode_np` (the padded tail), the accepted count kept per
  request slot (a decode after a step that accepted drafts reads at an offset).

Pure functions over plain data; the tally is what `bench/row_classes.py` and the conform target's
statistics count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from mambafuzz.conform.rows import RowInput, StepInput

# Per row.
FIRST_CHUNK = "prefill-first-chunk"  # no prior state, several tokens
FIRST_CHUNK_ONE_TOKEN = "prefill-first-chunk-one-token"  # no prior state, one token
LATER_CHUNK = "prefill-later-chunk"  # prior state, several tokens
LATER_CHUNK_ONE_TOKEN = "prefill-later-chunk-one-token"  # prior state, one token: runs as a decode
PADDED_TAIL_FRESH = "padded-prompt-tail-fresh"  # a one-token prompt plus placeholder drafts: a prefill
PADDED_TAIL_WITH_STATE = "padded-prompt-tail-with-state"  # the last prompt token after computed ones: a spec decode
DECODE = "decode"  # a decode in an engine without drafts
SPEC_DECODE_FULL = "spec-decode-all-drafts"  # every draft the engine proposes
SPEC_DECODE_CUT = "spec-decode-drafts-cut"  # some drafts, fewer than the engine proposes
ZERO_DRAFT_DECODE = "spec-decode-zero-drafts"  # a decode with no drafts in a spec engine
ZERO_DRAFT_AFTER_ACCEPT = "spec-decode-zero-drafts-after-accept"  # ... right after a step that accepted some
# Per batch (a step's rows together).
BATCH_SPEC_NO_DRAFTS = "batch:spec-engine-no-drafts"  # decodes, none of them drafted
BATCH_ONE_TOKEN_BESIDE_SPEC = "batch:one-token-prefill-beside-spec-rows"  # GDN counts it a prefill, not a decode
BATCH_PREFILL_AND_DECODE = "batch:prefills-beside-decodes"

ROW_CLASSES = (FIRST_CHUNK, FIRST_CHUNK_ONE_TOKEN, LATER_CHUNK, LATER_CHUNK_ONE_TOKEN, PADDED_TAIL_FRESH,
               PADDED_TAIL_WITH_STATE, DECODE,
               SPEC_DECODE_FULL, SPEC_DECODE_CUT, ZERO_DRAFT_DECODE, ZERO_DRAFT_AFTER_ACCEPT)
BATCH_CLASSES = (BATCH_SPEC_NO_DRAFTS, BATCH_ONE_TOKEN_BESIDE_SPEC, BATCH_PREFILL_AND_DECODE)
ALL_CLASSES = ROW_CLASSES + BATCH_CLASSES
SPEC_ONLY = frozenset({PADDED_TAIL_FRESH, PADDED_TAIL_WITH_STATE, SPEC_DECODE_FULL, SPEC_DECODE_CUT, ZERO_DRAFT_DECODE, ZERO_DRAFT_AFTER_ACCEPT,
                       BATCH_SPEC_NO_DRAFTS, BATCH_ONE_TOKEN_BESIDE_SPEC})


def row_class(r: RowInput, spec_tokens: int, accepted_before: int = 1) -> str:
    """The class of row `r` in an engine proposing `spec_tokens` drafts; `accepted_before` is the
    tokens the request's previous step kept (1 + accepted drafts)."""
    if r.num_computed < r.num_prompt_tokens:  # the row's first token is a prompt token
        if r.num_drafts > 0:
            return PADDED_TAIL_WITH_STATE if r.num_computed else PADDED_TAIL_FRESH
        one = r.num_scheduled == 1
        if r.num_computed == 0:
            return FIRST_CHUNK_ONE_TOKEN if one else FIRST_CHUNK
        return LATER_CHUNK_ONE_TOKEN if one else LATER_CHUNK
    if not spec_tokens:
        return DECODE
    if r.num_drafts == 0:
        return ZERO_DRAFT_AFTER_ACCEPT if accepted_before > 1 else ZERO_DRAFT_DECODE
    return SPEC_DECODE_FULL if r.num_drafts >= spec_tokens else SPEC_DECODE_CUT


def batch_classes(rows: Iterable[str], spec_tokens: int) -> set[str]:
    """The batch classes of a step whose rows have the classes `rows`."""
    kinds = set(rows)
    drafted = kinds & {SPEC_DECODE_FULL, SPEC_DECODE_CUT, PADDED_TAIL_FRESH, PADDED_TAIL_WITH_STATE}
    zero_drafts = kinds & {ZERO_DRAFT_DECODE, ZERO_DRAFT_AFTER_ACCEPT}
    decodes = drafted | zero_drafts | (kinds & {DECODE})
    out = set()
    if spec_tokens and zero_drafts and not drafted:
        out.add(BATCH_SPEC_NO_DRAFTS)
    if kinds & {FIRST_CHUNK_ONE_TOKEN, LATER_CHUNK_ONE_TOKEN} and (drafted or zero_drafts):
        out.add(BATCH_ONE_TOKEN_BESIDE_SPEC)
    if decodes and any(k.startswith("prefill-") for k in kinds):
        out.add(BATCH_PREFILL_AND_DECODE)
    return out


@dataclass
class ClassTally:
    """Rows and batches per class over the steps fed; `accepted` remembers each request's last kept count."""

    spec_tokens: int
    counts: Counter = field(default_factory=Counter)
    accepted: dict[str, int] = field(default_factory=dict)

    def feed(self, step: StepInput) -> set[str]:
        """Count one step's rows and batch; returns the classes it reached."""
        for rid in step.finished | step.preempted | step.resumed:
            self.accepted.pop(rid, None)
        kinds = [row_class(r, self.spec_tokens, self.accepted.get(r.req_id, 1)) for r in step.rows]
        for r in step.rows:
            self.accepted[r.req_id] = r.num_sampled
        reached = set(kinds) | batch_classes(kinds, self.spec_tokens)
        self.counts.update(kinds)
        self.counts.update(reached - set(kinds))
        return reached


@dataclass
class ClassCoverage:
    """How many inputs reached each class, per runner: what a conform campaign reports, so a
    class no input reached is named instead of silently never tested."""

    inputs: dict[str, Counter] = field(default_factory=dict)

    def add(self, runner: str, reached: Iterable[str]) -> None:
        self.inputs.setdefault(runner, Counter()).update(set(reached))

    def to_json(self) -> dict[str, dict[str, int]]:
        return {r: dict(c) for r, c in self.inputs.items()}

    @classmethod
    def merged(cls, parts: Iterable[dict[str, dict[str, int]]]) -> ClassCoverage:
        out = cls()
        for part in parts:
            for runner, counts in (part or {}).items():
                out.inputs.setdefault(runner, Counter()).update(counts)
        return out

    def missing(self, runner: str) -> list[str]:
        got = self.inputs.get(runner, Counter())
        return [c for c in ALL_CLASSES if not got.get(c)]

    def line(self) -> str:
        """`v1 12/13 v2 11/13`: classes reached per runner."""
        return " ".join(f"{r} {len(ALL_CLASSES) - len(self.missing(r))}/{len(ALL_CLASSES)}"
                        for r in sorted(self.inputs))
