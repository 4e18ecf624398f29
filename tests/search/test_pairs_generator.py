"""The `pairs` generator (mambafuzz/search/pairs_worker.py): state-coverage features, which inputs
the search keeps and mutates, and a campaign that finds a planted split bug from inputs it drew."""

import json
import random
from collections import Counter
from pathlib import Path

from mambafuzz.checks import pipeline
from mambafuzz.model.generate import scenario_from_bytes
from mambafuzz.model.inputs import decode_input
from mambafuzz.search import pair_search, state_coverage
from mambafuzz.search.pair_search import PairSearch
from mambafuzz.store.corpus import load_case
from tests.search.test_fuzz_cli import mambafuzz

ROOT = Path(__file__).resolve().parents[2]


def test_the_features_are_each_dimension_and_each_pair_named_one_way():
    f = state_coverage.features(["event:b", "knob:a", "event:a"])
    assert len(f) == 3 + 3
    assert ("event:a", "event:b") in f and ("event:b", "event:a") not in f and "knob:a" in f
    assert state_coverage.features(["knob:a"]) == frozenset({"knob:a"})


def test_the_search_keeps_an_input_only_when_it_reaches_a_feature_none_reached():
    search = PairSearch(random.Random(0))
    assert search.observe(b"a", frozenset({"x", ("x", "y")}))
    assert not search.observe(b"b", frozenset({"x"}))  # nothing new
    assert search.observe(b"c", frozenset({"x", "z"}))
    assert [k.data for k in search.pool] == [b"a", b"c"]
    assert search.counts["x"] == 3


def test_parents_that_reached_rare_features_are_mutated_most():
    search = PairSearch(random.Random(1))
    search.observe(b"common", frozenset({"c"}))
    for _ in range(200):
        search.observe(b"again", frozenset({"c"}))
    search.observe(b"rare", frozenset({"c", "r"}))
    picks = Counter(search._parent().data for _ in range(1000))
    assert picks[b"rare"] > 900, picks


def test_fresh_draws_until_something_is_kept_then_mostly_mutations():
    rng = random.Random(2)
    search = PairSearch(rng)
    first = search.next_input()
    assert search.fresh == 1 and pair_search.FRESH_LEN[0] <= len(first) <= pair_search.FRESH_LEN[1]
    search.observe(first, frozenset({"x"}))
    for _ in range(300):
        search.next_input()
    assert 0.6 < search.mutated / 300 < 0.8, search.mutated


def test_mutations_are_bounded_bytes_that_differ_and_still_decode():
    rng = random.Random(3)
    pool = [pair_search.Kept(bytes(range(40)), frozenset())]
    changed = 0
    for _ in range(300):
        out = pair_search.mutate(bytes(range(64)), rng, pool)
        assert isinstance(out, bytes) and 1 <= len(out) <= pair_search.MAX_LEN
        changed += out != bytes(range(64))
        scenario_from_bytes(out)  # any bytes decode to a scenario
    assert changed > 250


def test_a_pairs_campaign_finds_the_planted_split_bug_from_inputs_it_drew(tmp_path):
    # what unmodified vLLM fails with (reported upstream, open candidates) is known: the planted bug is what is new
    proc = mambafuzz("fuzz", "--split", "prefix", "--generator", "pairs", "--max-time", "90", "--stop-on-first",
                     "--corpus", str(tmp_path / "corpus"), "--seeds", "--known",
                     *(str(ROOT / "corpus" / d) for d in ("regressions", "upstream", "untriaged")),
                     "--findings", str(tmp_path / "findings"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted((tmp_path / "findings").glob("*.json"))
    assert len(files) == 1, proc.stdout[-3000:]
    case = json.loads(files[0].read_text())
    assert case["finding"]["origin"]["input"] == "pairs" and case["finding"]["origin"]["engine"] == "pairs"
    # the planted split's failure: unmodified vLLM does not fail that way (a minimized case may still hit
    # one of unmodified vLLM's own open candidates, corpus/untriaged, under another signature)
    sig = case["finding"]["signature"]
    assert sig == pipeline.signature_of(load_case(files[0]).scenario, "prefix")
    assert pipeline.signature_of(load_case(files[0]).scenario, "fixed") != sig


def test_a_pairs_campaign_keeps_what_reached_new_pairs_in_its_corpus_and_reports_coverage(tmp_path):
    corpus = tmp_path / "corpus"
    proc = mambafuzz("fuzz", "--generator", "pairs", "--runs", "60", "--max-time", "300", "--corpus", str(corpus),
                     "--seeds", "--findings", str(tmp_path / "findings"), cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]  # 1: an untriaged candidate
    summary = next(x for x in proc.stdout.splitlines() if x.startswith("summary: "))
    assert int(summary.split()[1]) >= 60
    kept = list(corpus.iterdir())
    assert kept and all(decode_input(p.read_bytes()) is not None for p in kept)
    last = [x for x in proc.stdout.splitlines() if " execs " in x and " cov " in x][-1]
    assert f"corpus {len(kept)} " in last and "cov -" not in last, last


def test_a_pairs_worker_takes_back_what_an_earlier_campaign_kept(tmp_path):
    """The search starts from the byte inputs in its corpus (their features counted, each kept
    input a parent), as libFuzzer loads its corpus; a scenario file there is left to the replay."""
    from types import SimpleNamespace

    from mambafuzz.search.pairs_worker import pair_inputs
    from mambafuzz.search.worker_protocol import WorkerConfig

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"in{i}").write_bytes(random.Random(i).randbytes(64))
    (corpus / "case.json").write_text((ROOT / "corpus" / "seeds" / "mtp_acceptance_cycle.json").read_text())
    runtime = SimpleNamespace(feedback={})
    loop = pair_inputs(WorkerConfig(corpus=str(corpus), seed=1), runtime)
    next(loop)  # up to the first input: the corpus is loaded
    assert 1 <= runtime.feedback["corpus"] <= 3 and runtime.feedback["cov"] > 3
    loop.close()
    empty = SimpleNamespace(feedback={})
    other = pair_inputs(WorkerConfig(corpus=str(tmp_path / "none"), seed=1), empty)
    next(other)
    assert empty.feedback == {"cov": 0, "corpus": 0}
    other.close()
