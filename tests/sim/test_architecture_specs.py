"""The vLLM-facing side of engine.model: layer specs from vLLM's own state-shape functions, grouped by
vLLM's own uniform-page grouping, and the harness running each architecture."""

import dataclasses
import json

import pytest

from mambafuzz.model import architectures as registry
from mambafuzz.model.scenario import with_scheduling
from mambafuzz.sim.bridge import architectures as arch
from mambafuzz.sim.bridge import configs, scheduler_session
from mambafuzz.sim.bridge.vllm_compat import api

FULL_SIZE = [n for n in registry.MODELS if n != registry.DEFAULT_MODEL]


def _groups(name: str, spec_blocks: int = 0):
    return tuple(configs.kv_cache_groups_for(16, 256, True, spec_blocks, 0, None, name))


@pytest.mark.parametrize("name", FULL_SIZE)
def test_declared_group_count_is_vllms_grouping_of_the_layer_specs(name):
    a = registry.get(name)
    for spec_blocks in (0, 2) if a.mtp_layers else (0,):
        counts = arch.group_counts(_groups(name, spec_blocks))
        assert counts == {"mamba": a.mamba_groups, "attention": 1}, (spec_blocks, counts)


def test_default_model_keeps_the_bridges_own_specs():
    groups = configs.kv_cache_groups_for(16, 256, True, 0, 0, None)
    assert groups == configs.kv_cache_groups_for(16, 256, True, 0, 0, None, registry.DEFAULT_MODEL)
    assert sorted(n for g in groups for n in g.layer_names) == sorted([*configs.MAMBA_LAYERS, configs.ATTN_LAYER])
    assert arch.group_counts(groups) == {"mamba": registry.get(registry.DEFAULT_MODEL).mamba_groups, "attention": 1}


def test_state_shapes_come_from_the_model_classes_own_functions():
    shapes, dtypes, source = arch.mamba_state("nemotron_h_8b", 0)
    assert source == "NemotronHForCausalLM.get_mamba_state_shape_from_config"
    # mamba2_state_shape: conv_dim = heads * head_dim + 2 * n_groups * state = 8192 + 2048, kernel - 1 = 3
    assert sorted(shapes[0]) == [3, 10240] and shapes[1] == (128, 64, 128)
    # the conv state grows by the speculative tokens (num_spec)
    assert sorted(arch.mamba_state("qwen3_next_80b", 2)[0][0]) == [5, 8192]
    assert arch.mamba_state("falcon_h1_7b", 0)[2].startswith("FalconH1ForCausalLM")


def test_mtp_adds_the_drafters_attention_layer():
    plain = arch.layer_specs("qwen3_next_80b", 16, 256, True, 0, 0, None, lambda k: k)
    mtp = arch.layer_specs("qwen3_next_80b", 16, 256, True, 2, 0, None, lambda k: k)
    assert set(mtp) - set(plain) == {"mtp.layers.0.self_attn.attn"}
    assert isinstance(mtp["mtp.layers.0.self_attn.attn"], api.FullAttentionSpec)


def test_pages_are_padded_to_one_size():
    specs = arch.layer_specs("falcon_h1_7b", 16, 256, True, 0, 0, None, lambda k: k)
    assert len({s.page_size_bytes for s in specs.values()}) == 1


def test_sliding_window_layers_get_their_own_group(monkeypatch):
    swa = dataclasses.replace(registry.get("nemotron_h_8b"), name="swa_test", layout="MMMSMMMA", sliding_window=64)
    monkeypatch.setitem(registry.ARCHITECTURES, "swa_test", swa)
    specs = arch.layer_specs("swa_test", 16, 256, True, 0, 0, None, lambda k: k)
    assert isinstance(specs["model.layers.3.self_attn.attn"], api.SlidingWindowSpec)
    counts = arch.group_counts(api.get_kv_cache_groups_uniform_page_size(specs))
    assert counts == {"mamba": 6, "sliding_window": 1, "attention": 1}


@pytest.mark.parametrize("name", FULL_SIZE)
def test_declared_block_size_is_the_platform_rules(name):
    assert registry.get(name).vllm_block_size == arch.align_block_size(name)


def test_align_block_size_is_platform_rule():
    # _align_hybrid_block_size: 16 * cdiv(mamba page, 16 * attention page of one token)
    mamba_page = (3 * 10240 + 128 * 64 * 128) * 2  # bf16 conv + ssm state
    attn_token = 2 * 8 * 128 * 2  # k and v, 8 kv heads, head_dim 128, bf16
    assert arch.mamba_page_bytes("nemotron_h_8b") == mamba_page
    assert arch.align_block_size("nemotron_h_8b") == 16 * -(-mamba_page // (16 * attn_token)) == 528
    assert arch.align_block_size("nemotron_h_8b", block_size=1024) == 1024


@pytest.mark.parametrize("name", ["nemotron_h_8b", "falcon_h1_7b"])
def test_harness_runs_the_architecture_and_names_it(name, tmp_path):
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.model.scenario import loads
    from mambafuzz.store.report import step_table

    raw = json.loads((configs.TINY_MODEL_DIR.parent.parent / "corpus/seeds/shared_prefix_block_hits.json").read_text())
    raw["engine"]["model"] = name
    for key in ("expected", "expected_by_vllm"):
        raw.pop(key, None)
    ev = evaluate(loads(json.dumps(raw)), "fixed")
    assert ev.verdict.clean
    a = registry.get(name)
    header = step_table(ev.trace).splitlines()[0]
    assert header.startswith(f"model {a.title} ({name}): {a.mamba_groups + 1} KV-cache groups")
    assert f"{a.mamba_groups} mamba" in header and "align-mode block size" in header


def _seed_case(name: str):
    from mambafuzz.store.corpus import load_case

    return load_case(configs.TINY_MODEL_DIR.parent.parent / "corpus/seeds" / name).scenario


def test_every_mamba_group_gets_its_own_kernel_model(monkeypatch):
    from mambafuzz.sim.engine import harness

    built = []
    real = harness.WorkerMirror

    def spy(models, spec):
        built.append(len(models))
        return real(models, spec)

    monkeypatch.setattr(harness, "WorkerMirror", spy)
    harness.run(_seed_case("granite_4_0_h_chunked_prefill.json"))
    assert built and set(built) == {registry.get("granite_4_0_h_small").mamba_groups}


def test_a_wrong_read_in_another_mamba_group_is_a_finding(monkeypatch):
    """Group 2's table of r1 swapped for r0's, in the scheduler's tables and in what it tells the worker
    alike: only that group starts r1 from a state not its own."""
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.sim.worker.worker_tables import WorkerTables

    def swapping(real):
        def swapped(self, rid):
            tables = real(self, rid)
            other = real(self, "r0" if rid == "r1" else "r1")
            # the mamba groups' tables (the attention group's worker tables, one list, are left alone)
            if rid in ("r0", "r1") and other and tables and len(tables) > 1 and other[0] and tables[0]:
                return (tables[0], other[1], *tables[2:])
            return tables
        return swapped

    # synchronous: under async scheduling the case also holds the in-flight state block beyond vLLM's
    # start-up reserve (corpus/upstream/async_inflight_state_block_beyond_startup_reserve)
    scenario = with_scheduling(_seed_case("nemotron_h_shared_prefix_hits.json"), "sync")
    assert evaluate(scenario, "fixed").verdict.clean
    for view in ("mamba_tables", "mamba_block_lists"):  # the scheduler's tables: ids, and vLLM's own lists
        monkeypatch.setattr(scheduler_session.SchedulerSession, view, swapping(getattr(scheduler_session.SchedulerSession, view)))
    monkeypatch.setattr(WorkerTables, "get", swapping(WorkerTables.get))
    verdict = evaluate(scenario, "fixed", differential=False).verdict
    assert not verdict.clean and "mamba KV-cache group 2" in verdict.findings[0].message
