"""--max-time is the campaign's wall-clock budget: a worker's start-up (importing vLLM,
instrumenting) comes out of it instead of being added to it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mambafuzz.search.supervisor import CampaignConfig, launches
from mambafuzz.search.worker_protocol import MIN_FUZZ_SECONDS, WorkerConfig


def campaign(generator: str, tmp_path: Path, max_time: float = 60.0) -> CampaignConfig:
    return CampaignConfig(generator=generator, split="fixed", max_time=max_time, runs=0, jobs=2, seed=1,
                          corpus=tmp_path / "c", seed_dirs=[], findings=tmp_path / "f", known_dirs=[],
                          stop_on_first=False, minimize_budget=1.0, rss_limit_mb=0)


@pytest.mark.parametrize("generator", ["random", "atheris"])
def test_every_worker_gets_the_campaigns_end_not_a_fresh_budget(generator, tmp_path):
    before = time.time()
    out = launches(campaign(generator, tmp_path), tmp_path)
    assert len(out) == 2
    for launch in out:
        assert before + 60 <= launch.config.deadline <= time.time() + 60


def test_no_max_time_means_no_deadline(tmp_path):
    assert all(launch.config.deadline == 0 for launch in launches(campaign("random", tmp_path, 0), tmp_path))


def test_start_up_comes_out_of_the_budget_with_a_floor():
    config = WorkerConfig(max_time=60, deadline=1000.0)
    assert config.fuzz_seconds(60, now=980.0) == 20.0  # 40 s went to start-up
    assert config.fuzz_seconds(60, now=1500.0) == MIN_FUZZ_SECONDS  # a slow start still runs inputs
    assert WorkerConfig(max_time=60).fuzz_seconds(60, now=980.0) == 60  # no deadline: the budget as given
