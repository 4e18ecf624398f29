"""The mixer mirror agrees with vLLM's own GDN and Mamba2 metadata builders (run on CPU) on the
rows that tell the runners and families apart (fuzz/conform.py)."""

import pytest

from fuzz.conform import check
from fuzz.runners import RowFacts

# (computed, scheduled, drafts, prompt tokens, prefill_len), accepted count
ROWS = [
    (RowFacts(0, 2, 1, 1, 1), 1),  # a one-token prompt padded with a placeholder draft
    (RowFacts(7, 2, 1, 8, 8), 1),  # a padded prompt tail over computed tokens
    (RowFacts(10, 2, 1, 8, 8), 2),  # a decode with a draft, after 2 accepted tokens
    (RowFacts(10, 1, 0, 8, 8), 2),  # a decode with no draft
    (RowFacts(7, 1, 0, 8, 8), 1),  # the last prompt token, unpadded
    (RowFacts(0, 8, 0, 20, 20), 1),  # a first prefill chunk
    (RowFacts(8, 8, 0, 20, 20), 1),  # a later prefill chunk
    (RowFacts(10, 2, 0, 8, 12), 1),  # replaying outputs after preemption, 2 tokens
    (RowFacts(11, 1, 0, 8, 12), 1),  # ... and its last token
]


@pytest.mark.parametrize("k", [1, 0], ids=["mtp-k1", "no-spec"])
def test_the_mirror_classifies_rows_as_vllms_builders_do(k):
    rows = ROWS if k else [(r, 1) for r, _ in ROWS if r.num_drafts == 0]
    assert check(rows, block_size=16, num_speculative_tokens=k) == []
