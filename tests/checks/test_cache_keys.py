"""The attention groups' prefix-cache keys (`attention_key`, mambafuzz/checks/cache_keys.py): a cached
attention block carries its request's own hash at its position, checked as vLLM frees the request.
vLLM's tests/v1/core/test_prefix_caching.py asserts it for its inputs (`test_prefill`: block i's
`get_block_hash` is the hash of the first (i + 1) * 16 tokens, `get_group_id` its group)."""

from mambafuzz.checks import cache_keys
from mambafuzz.checks.pipeline import evaluate
from mambafuzz.sim import patching
from mambafuzz.sim.trace import Trace
from mambafuzz.tools.mutation import planting
from tests.checks.test_resources import RESEND, kinds, scenario

# One request: a chunked prefill (two chunks of 64 over 32-token blocks) and decodes past two more blocks
LONE = scenario({"mamba_block_size": 32, "attn_block_size": 32, "max_num_batched_tokens": 64},
                [{"unique_len": 90, "max_tokens": 40}])


def test_keys_one_hash_unit_early_are_found_where_nothing_else_sees_them():
    """The planted bug publishes full-attention block i under the hash of the unit before it. The
    kernel model follows mamba states only, so a run without a later hit shows nothing else: before
    the rule it was clean."""
    assert kinds(LONE) == []
    with patching.applied(planting.patches("cache_attention_key_one_unit_early")):
        ev = evaluate(LONE, "fixed", efficiency=False)
    assert [f.signature for f in ev.verdict.findings] == ["attention_key:wrong-hash"], ev.verdict.findings
    finding = ev.verdict.findings[0]
    freed = next(rec.step for rec in ev.trace.steps if "r0" in rec.finished)
    assert finding.step == freed and finding.request_id == "r0"
    assert "block 2 at column 1 of its KV-cache group 0 (attention) carried a key for 64 tokens" in finding.message


def test_a_resend_with_wrong_keys_misses_its_hit_and_names_the_keys():
    """With a resend, the wrong keys also cost the resend its hit (`missed_hit`, the primary finding);
    the keys are named beside it."""
    assert kinds(RESEND) == []
    assert kinds(RESEND, "cache_attention_key_one_unit_early") == \
        ["missed_hit:below-prompt-checkpoint", "attention_key:wrong-hash"]


def test_partial_tail_keys_are_the_requests_hash_at_their_boundary():
    """Fine hash units (8 tokens in 32-token blocks): full attention also keys a prompt's tail inside its
    block by the hash at the tail's boundary (`cache_partial_block`); the rule accepts those keys."""
    s = scenario({"mamba_block_size": 32, "attn_block_size": 32, "max_num_batched_tokens": 64, "prefix_match_unit": 8},
                 [{"prefix_ids": [0], "unique_len": 13, "max_tokens": 3},
                  {"arrival_step": 10, "prefix_ids": [0], "unique_len": 30, "max_tokens": 3}], prefixes=[50])
    ev = evaluate(s, "fixed", efficiency=False)
    assert ev.verdict.clean, ev.verdict.findings
    assert ev.trace.attention_keys == []


def test_the_location_says_what_is_wrong():
    t = Trace(split="fixed", prefix_caching=True)
    assert cache_keys.check_attention_keys(t) is None
    for what, where in [("a key for 64 tokens that is not the request's hash of its first 64 tokens", "wrong-hash"),
                        ("the request's hash for 64 tokens under another group's id", "wrong-group"),
                        ("a key for 96 tokens, not inside column 1 (tokens 32..64)", "wrong-position"),
                        ("a key for 96 tokens, past the request's 64 hashed tokens", "wrong-position")]:
        t.attention_keys = [(3, "r1", 0, 1, 9, what)]
        found = cache_keys.check_attention_keys(t)
        assert found.signature == f"attention_key:{where}" and found.step == 3 and found.request_id == "r1"
