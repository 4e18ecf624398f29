"""Each planted worker-code bug (mambafuzz.tools.mutation.planted, the `worker_*` family) has a kept case in
bench/mutation_cases/ on which the conformance tier agrees with unmodified vLLM 0.32.0 and disagrees
once the bug is planted, signed by the runner and mixer whose code it changes.  The cases' notes say
where each came from (the PR job's fuzzing, or a hand-written probe)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mambafuzz.conform.target import first_disagreement, signature
from mambafuzz.model.scenario import from_json
from mambafuzz.sim import patching
from mambafuzz.tools.mutation import planted, planting

CASES = Path(__file__).resolve().parents[2] / "bench" / "mutation_cases"

# mutant -> (its kept case, the signature its planted bug must produce first)
WORKER_MUTANTS = {
    "worker_gdn_zero_draft_plain_decode": ("worker_gdn_zero_draft_after_accept.json", "conform:read/gdn@v1"),
    "worker_mamba_first_token_has_state": ("worker_mamba_one_token_first_chunk.json", "conform:read/mamba2@v1"),
    "worker_v2_padded_tail_as_prefill": ("worker_v2_padded_tail_as_prefill.json", "conform:writes/gdn@v2"),
    "worker_v2_state_column_in_cache_blocks": ("worker_v2_state_column_in_cache_blocks.json", "conform:precopy/gdn@v2"),
}


def test_every_worker_mutant_has_a_kept_case():
    assert {n for n in planted.MUTANTS if n.startswith("worker_")} == set(WORKER_MUTANTS)


@pytest.mark.parametrize("name", sorted(WORKER_MUTANTS))
def test_the_kept_case_agrees_unmodified_and_disagrees_with_the_bug_planted(name: str):
    case, expected = WORKER_MUTANTS[name]
    s = from_json(json.loads((CASES / case).read_text()))
    assert first_disagreement(s, ("v1", "v2")) is None
    with patching.applied(planting.patches(name)):
        found = first_disagreement(s, ("v1", "v2"))
    assert found is not None and signature(found) == expected
    assert first_disagreement(s, ("v1", "v2")) is None  # the patch is gone again


def test_a_state_column_seeded_past_the_table_reads_the_null_block_every_time():
    """V2's driver tables are wider than vLLM's rows, their spare columns the null block: the
    pre-copy from a column seeded in the wrong units reads block 0, not memory past the tensor
    (which Triton's interpreter returns differently on each run), and its source is compared."""
    case, _ = WORKER_MUTANTS["worker_v2_state_column_in_cache_blocks"]
    s = from_json(json.loads((CASES / case).read_text()))
    with patching.applied(planting.patches("worker_v2_state_column_in_cache_blocks")):
        found = [first_disagreement(s, ("v2",)) for _ in range(2)]
    assert all(f is not None and f.vllm == found[0].vllm for f in found)
    ((src, dst),) = found[0].vllm[2]
    assert src == 0 and dst == found[0].row.block_ids[-1]
