"""A new model runner or input generator is one registry entry: a test-only one, registered at test
time, is accepted by validation, offered by the CLI's choices, and dispatched through its entry by
the bridge, the kernel model, the conformance tier, the supervisor and the benches; an unknown name
is a one-line error, never V1 or libFuzzer."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mambafuzz.cli.main import build_parser, main
from mambafuzz.model import runners as model_runners
from mambafuzz.model.runners import Runner, UnknownRunner
from mambafuzz.model.scenario import validate, with_runner
from mambafuzz.search import generators
from mambafuzz.search.generators import Generator, Launch, UnknownGenerator
from mambafuzz.search.worker_protocol import WorkerConfig
from tests.conftest import first_chunk_scenario

ROOT = Path(__file__).resolve().parents[2]
T3 = Runner("t3", "Model Runner T3", "test_registries.py", use_v2_model_runner=True)


@pytest.fixture
def t3(monkeypatch):
    """A third runner: its own entry, V1's row facts in the kernel model under a recording class."""
    from mambafuzz.sim.worker import runners as sim_runners

    class T3Rules(sim_runners.V1Runner):
        name = "t3"
        calls = 0

        @staticmethod
        def builder_inputs(row, spec_engine, num_speculative_tokens=0):
            T3Rules.calls += 1
            return sim_runners.V1Runner.builder_inputs(row, spec_engine, num_speculative_tokens)

    monkeypatch.setitem(model_runners.RUNNERS, "t3", T3)
    monkeypatch.setitem(sim_runners.RULES, "t3", T3Rules)
    return T3Rules


def test_validation_accepts_a_runner_once_it_is_registered(monkeypatch):
    s = first_chunk_scenario()
    s.engine.runner = "t3"
    assert any("engine.runner" in p for p in validate(s))
    with pytest.raises(ValueError, match="runner must be one of v1, v2"):
        with_runner(first_chunk_scenario(), "t3")
    monkeypatch.setitem(model_runners.RUNNERS, "t3", T3)
    assert validate(s) == []
    assert with_runner(first_chunk_scenario(), "t3").engine.runner == "t3"


@pytest.mark.parametrize("argv", [["repro", "x.json"], ["minimize", "x.json"], ["fuzz"], ["conform", "x.json"]])
def test_every_runner_option_offers_a_registered_runner(argv, monkeypatch):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--runner", "t3"])
    monkeypatch.setitem(model_runners.RUNNERS, "t3", T3)
    runner = build_parser().parse_args([*argv, "--runner", "t3"]).runner
    assert runner in ("t3", ["t3"])


def test_the_bridge_tells_the_scheduler_the_entrys_flag_and_never_takes_an_unknown_runner_for_v1(t3, monkeypatch):
    from mambafuzz.model.scenario import ample_pool_blocks
    from mambafuzz.sim.bridge import scheduler_session

    s = first_chunk_scenario()

    def session(runner: str) -> scheduler_session.SchedulerSession:
        engine = dataclasses.replace(s.engine, runner=runner)
        return scheduler_session.SchedulerSession(engine, ample_pool_blocks(s), s.max_model_len(), None, s.uses_connector)

    assert session("t3").scheduler.use_v2_model_runner is True
    monkeypatch.setitem(model_runners.RUNNERS, "t3", dataclasses.replace(T3, use_v2_model_runner=False))
    assert session("t3").scheduler.use_v2_model_runner is False
    with pytest.raises(UnknownRunner, match="unknown model runner 't9'"):
        session("t9")


def test_a_run_on_a_registered_runner_uses_its_kernel_model_rules(t3):
    from mambafuzz.checks.pipeline import evaluate

    ev = evaluate(first_chunk_scenario(), "fixed", differential=False, efficiency=False, runner="t3")
    assert ev.trace.runner == "t3" and t3.calls > 0


def test_vllms_pick_maps_back_through_the_registry(monkeypatch):
    from mambafuzz.sim.bridge.configs import default_runner

    no_features = SimpleNamespace(_get_v2_model_runner_unsupported_features=lambda: [])
    monkeypatch.setitem(model_runners.RUNNERS, "t3", dataclasses.replace(T3, vllm_picks=True))
    with pytest.raises(UnknownRunner, match="2 registered model runners are vLLM's pick"):
        default_runner(no_features)  # v2 and t3 both claim the flag: an error, not a guess
    monkeypatch.setitem(model_runners.RUNNERS, "v2", dataclasses.replace(model_runners.RUNNERS["v2"], vllm_picks=False))
    assert default_runner(no_features) == "t3"
    assert model_runners.picked_by_vllm(False).name == "v1"  # what the audit plugin reads of a live engine


def test_a_runner_without_rules_or_a_conformance_worker_is_a_one_line_error(monkeypatch):
    from mambafuzz.conform import drive
    from mambafuzz.sim.worker.runners import runner_rules

    monkeypatch.setitem(model_runners.RUNNERS, "t3", T3)
    with pytest.raises(UnknownRunner, match="no kernel-model rules"):
        runner_rules("t3")
    with pytest.raises(UnknownRunner, match="no conformance worker"):
        drive.worker_class("t3")
    worker = type("T3Worker", (), {"runner": "t3"})
    monkeypatch.setitem(drive.WORKERS, "t3", worker)
    assert drive.worker_class("t3") is worker


def test_a_test_only_runner_is_held_against_vllms_worker_code_by_the_conformance_tier(t3, monkeypatch):
    """The whole of a third runner lives in this file: its entry, its kernel-model rules (the
    fixture) and its conformance worker (V1's worker code under the new name). The conformance
    tier builds its worker from the registry, tags its rows with its name, and runs its rules."""
    from mambafuzz.conform import compare, drive, v1
    from mambafuzz.conform.rows import RowPlan

    monkeypatch.setitem(drive.WORKERS, "t3", type("T3Worker", (v1.V1Worker,), {"runner": "t3"}))
    planned: list[RowPlan] = []
    real_step = drive.ConformStep

    def recording_step(step, step_input, plans):
        planned.extend(plans)
        return real_step(step, step_input, plans)

    monkeypatch.setattr(drive, "ConformStep", recording_step)
    assert list(compare.compare(first_chunk_scenario(), ("t3",))) == []
    assert planned and {p.runner for p in planned} == {"t3"} and t3.calls > 0


def test_every_registered_runner_has_rules_and_a_conformance_worker():
    from mambafuzz.conform.drive import WORKERS
    from mambafuzz.sim.worker.runners import RULES

    assert set(RULES) == set(WORKERS) == set(model_runners.RUNNERS)
    assert all(RULES[n].name == n and WORKERS[n].runner == n for n in model_runners.RUNNERS)


# Generators


def _stand_in(*events: str) -> list[str]:
    return [sys.executable, "-c", "".join(f"print({e!r}, flush=True); " for e in events)]


def _campaign(tmp_path: Path, generator: str, jobs: int = 2):
    from mambafuzz.search.supervisor import CampaignConfig

    return CampaignConfig(generator=generator, split="fixed", max_time=30, runs=0, jobs=jobs, seed=1,
                          corpus=tmp_path / "c", seed_dirs=[], findings=tmp_path / "f", known_dirs=[],
                          stop_on_first=False, minimize_budget=1, rss_limit_mb=0, quiet=True)


@pytest.fixture
def t_gen(monkeypatch):
    """A test-only generator whose workers are stand-ins that run three inputs each."""
    seen: list = []

    def launch(cfg, workdir, configs):
        seen.append((cfg, workdir, configs))
        return [Launch(_stand_in('@@event {"event":"started","pid":1}', '@@event {"event":"done","pid":1,"execs":3}'),
                       c) for c in configs]

    gen = Generator("t-gen", "a test-only generator", launch, decoder="hypothesis")
    monkeypatch.setitem(generators.GENERATORS, "t-gen", gen)
    return seen


def test_the_generator_option_offers_a_registered_generator(monkeypatch):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["fuzz", "--generator", "t-gen"])
    monkeypatch.setitem(generators.GENERATORS, "t-gen", Generator("t-gen", "a test-only generator", generators.libfuzzer))
    assert build_parser().parse_args(["fuzz", "--generator", "t-gen"]).generator == "t-gen"
    fuzz = build_parser()._subparsers._group_actions[0].choices["fuzz"]
    assert "t-gen (a test-only generator)" in " ".join(fuzz.format_help().split())


def test_the_supervisor_starts_what_the_generators_entry_launches(t_gen, tmp_path):
    from mambafuzz.search import supervisor

    result = supervisor.run_campaign(_campaign(tmp_path, "t-gen"), out=open(os.devnull, "w"))
    assert result.problems == [] and result.execs == 6
    [(cfg, _, configs)] = t_gen
    assert cfg.generator == "t-gen" and [c.generator for c in configs] == ["t-gen", "t-gen"]
    assert generators.get(WorkerConfig(generator="t-gen").generator).decoder == "hypothesis"  # the worker decodes as its entry says


def test_every_generators_decoder_exists():
    from mambafuzz.model.inputs import DECODERS, decode_input

    assert {g.decoder for g in generators.GENERATORS.values()} <= set(DECODERS)
    with pytest.raises(ValueError, match="unknown decoder 'nope'"):
        decode_input(b"x", "nope")  # not the bytes decoder


def test_an_unknown_generator_is_a_one_line_error_not_libfuzzer(tmp_path):
    from mambafuzz.search import supervisor

    with pytest.raises(UnknownGenerator, match="unknown generator 'nope'"):
        supervisor.launches(_campaign(tmp_path, "nope"), tmp_path)
    with pytest.raises(UnknownGenerator):
        generators.get(WorkerConfig(generator="nope").generator)


def test_fuzz_checks_the_generators_needs_and_targets_from_its_entry(t_gen, tmp_path, monkeypatch, capsys):
    from mambafuzz.search import supervisor

    ran = []
    monkeypatch.setattr(supervisor, "run_campaign", lambda cfg: ran.append(cfg) or supervisor.CampaignResult(
        new_files=[], execs=3, seconds=1.0, coverage=None, corpus_size=None, interrupted=False, exit_codes=[0],
        first_finding_seconds=None, log_tail=[]))
    monkeypatch.setitem(sys.modules, "atheris", None)  # `import atheris` fails
    argv = ["fuzz", "--generator", "t-gen", "--max-time", "1", "--corpus", str(tmp_path / "c"),
            "--findings", str(tmp_path / "f"), "--seeds", "--known"]
    assert main(argv) == 0 and ran[0].generator == "t-gen"  # needs no atheris: runs without it
    entry = generators.GENERATORS["t-gen"]
    monkeypatch.setitem(generators.GENERATORS, "t-gen", dataclasses.replace(entry, needs_atheris=True))
    assert main(argv) == 2 and "--generator t-gen needs atheris" in capsys.readouterr().err
    monkeypatch.setitem(generators.GENERATORS, "t-gen", dataclasses.replace(entry, targets=("conform",)))
    assert main(argv) == 2 and "--generator t-gen cannot drive --target scheduler" in capsys.readouterr().err
    assert len(ran) == 1


@pytest.mark.parametrize("bench", ["time_to_bug", "mutation_score", "mutation_run"])
def test_the_benches_offer_a_registered_generator(bench, t_gen, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location(f"bench_{bench}", ROOT / "bench" / f"{bench}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", [bench, "--help"])
    with pytest.raises(SystemExit):
        module.main()
    assert "t-gen" in capsys.readouterr().out


def test_a_fuzz_target_is_one_registration_that_the_cli_and_a_worker_take(monkeypatch, tmp_path, capsys):
    """A test-only target (this file only): the CLI offers and accepts it, its own argument rule
    refuses what it refuses, and a worker's runtime builds its triage from the entry and files
    what its judge finds; an unknown target is a one-line error."""
    from mambafuzz.checks.pipeline import Judge
    from mambafuzz.findings import Violation
    from mambafuzz.search import fuzz_targets
    from mambafuzz.search.target_runtime import Runtime
    from mambafuzz.search.triage import Triage

    def verdict(scenario):
        return Violation("test_many:two-or-more", "two requests") if len(scenario.requests) > 1 else None

    def build(config, store):
        judge = Judge(config.split, verdict, lambda path, signature: f"repro {path}")
        return fuzz_targets.Built(Triage(store, config.split, judge, known_bugs=[], minimize_budget=0, announce=False))

    target = fuzz_targets.FuzzTarget("t-count", "counts requests", build,
                                     usage_error=lambda args: "--target t-count: no --base" if args.base else None,
                                     describe=lambda args: "request counts")
    monkeypatch.setitem(fuzz_targets.TARGETS, "t-count", target)
    assert "t-count (counts requests)" in fuzz_targets.help_text()
    assert build_parser().parse_args(["fuzz", "--target", "t-count", "--runs", "1"]).target == "t-count"
    assert main(["fuzz", "--target", "t-count", "--runs", "1", "--base", "installed"]) == 2
    assert "--target t-count: no --base" in capsys.readouterr().err

    rt = Runtime(WorkerConfig(target="t-count", findings=str(tmp_path)))
    assert rt.run_scenario(first_chunk_scenario(), {"input": "test"}) is True
    assert [f.signature for f in rt.triage.filed] == ["test_many:two-or-more"] and rt.row_classes is None
    with pytest.raises(fuzz_targets.UnknownTarget, match="one of scheduler, conform, t-count"):
        fuzz_targets.get("t-nope")


def test_a_worker_is_told_whether_its_target_needs_tritons_cpu_shim():
    from mambafuzz.search.supervisor import worker_config
    from mambafuzz.search.worker_protocol import CampaignConfig

    def told(target):
        cfg = CampaignConfig(generator="random", split="fixed", max_time=1, runs=0, jobs=1, seed=0, corpus=Path("c"),
                             seed_dirs=[], findings=Path("f"), known_dirs=[], stop_on_first=False, minimize_budget=0,
                             rss_limit_mb=0, target=target)
        return worker_config(cfg, 0).conform_kernels

    assert told("conform") is True and told("scheduler") is False
