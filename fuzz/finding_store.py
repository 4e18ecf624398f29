"""What happens to a violation once an engine finds one: check it reproduces, minimize it,
deduplicate it by signature, and write it (and the raw input) atomically.

Every engine (random loop, atheris target, Hypothesis target) hands its findings here, so
they are all filed the same way.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from fuzz.corpus import atomic_write, case_json, content_name, iter_cases, split_key
from fuzz.minimizer import minimize
from fuzz.pipeline import evaluate
from fuzz.scenario import Scenario, ScenarioError

REPRO_RUNS = 3


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:120]


def finding_signature(scenario: Scenario, split: str) -> str | None:
    try:
        v = evaluate(scenario, split, efficiency=False).verdict
    except ScenarioError:
        return None
    return None if v.clean else v.primary.signature


def known_signatures(dirs: list[Path], split: str, runner: str | None = None) -> set[str]:
    """Signatures already on file: recorded in a case's `finding` block, or obtained by
    replaying regression/upstream cases under this split. A finding recorded for one model
    runner (`finding.runner`) is known only to a campaign on that runner (`runner`, None: v2,
    vLLM's default on a CUDA host)."""
    known: set[str] = set()
    for case in iter_cases([d for d in dirs if d.exists()], warn=lambda msg: None):
        meta = case.extra.get("finding")
        if isinstance(meta, dict) and meta.get("runner") not in (None, runner or "v2"):
            continue
        if isinstance(meta, dict) and meta.get("split") == split and isinstance(meta.get("signature"), str):
            known.add(meta["signature"])
            by_runner = meta.get("signatures_by_runner")  # a case whose signature depends on the model runner
            if isinstance(by_runner, dict):
                known.update(v for v in by_runner.values() if isinstance(v, str))
            continue
        if any(kind != "clean" for key, kind in case.expected.items() if split_key(key)[0] == split):
            sig = finding_signature(case.scenario, split)
            if sig:
                known.add(sig)
    return known


STALE_TEMP_SECONDS = 300


def sweep_stale_temporaries(directory: Path) -> int:
    """Remove `.name.*.tmp` files a killed writer left behind.  Only old ones: a fresh one may
    belong to another live process about to rename it into place."""
    removed = 0
    now = time.time()
    for p in directory.rglob(".*.tmp"):
        try:
            if now - p.stat().st_mtime > STALE_TEMP_SECONDS:
                p.unlink()
                removed += 1
        except OSError:
            pass
    return removed


@dataclass
class Filed:
    signature: str
    path: Path
    flaky: bool
    repro_rate: str
    minimize_seconds: float
    size: tuple[int, int, int]


@dataclass
class FindingStore:
    findings_dir: Path
    split: str
    known: set[str] = field(default_factory=set)
    minimize_budget: float = 30.0
    repro_runs: int = REPRO_RUNS
    announce: bool = True
    filed: list[Filed] = field(default_factory=list)
    duplicates: int = 0

    def __post_init__(self) -> None:
        self.findings_dir = Path(self.findings_dir)
        self.findings_dir.mkdir(parents=True, exist_ok=True)
        sweep_stale_temporaries(self.findings_dir)
        for case in iter_cases([self.findings_dir], warn=lambda msg: None):
            meta = case.extra.get("finding")
            if isinstance(meta, dict) and meta.get("split") == self.split and meta.get("signature"):
                self.known.add(meta["signature"])

    def _fails_same(self, scenario: Scenario, signature: str) -> bool:
        try:
            v = evaluate(scenario, self.split, efficiency=False).verdict
        except ScenarioError:
            return False
        return not v.clean and v.primary.signature == signature

    def handle(self, scenario: Scenario, signature: str, message: str, origin: dict,
               raw: bytes | None = None) -> Filed | None:
        """File a finding unless its signature is already known; returns what was written."""
        if signature in self.known:
            self.duplicates += 1
            return None
        self.known.add(signature)
        name = slug(f"{self.split}-{signature}")
        if raw is not None:
            atomic_write(self.findings_dir / "raw" / f"{name}.{content_name(raw, '.bin')}", raw)
        decoded = scenario.dumps()
        atomic_write(self.findings_dir / "raw" / f"{name}.{content_name(decoded, '.decoded.json')}", decoded)
        hits = sum(self._fails_same(scenario, signature) for _ in range(self.repro_runs))
        rate = f"{hits}/{self.repro_runs}"
        flaky = hits < self.repro_runs
        t0 = time.monotonic()
        if flaky:
            small, seconds = scenario, 0.0
        else:
            result = minimize(scenario, lambda c: self._fails_same(c, signature), time_budget=self.minimize_budget)
            small, seconds = result.scenario, time.monotonic() - t0
        path = self.findings_dir / (f"flaky-{name}.json" if flaky else f"{name}.json")
        meta = {
            "signature": signature, "kind": signature.split(":")[0], "split": self.split, "message": message,
            "origin": origin, "reproduced": rate, "flaky": flaky,
            "minimized": {"requests": small.size()[0], "last_step": small.size()[1], "tokens": small.size()[2],
                          "seconds": round(seconds, 2), "from_size": list(scenario.size())},
            "repro": f"mambafuzz repro {path} --split {self.split}",
        }
        atomic_write(path, case_json(small, finding=meta, note=f"found by {origin.get('engine', '?')}: {message}"))
        filed = Filed(signature, path, flaky, rate, seconds, small.size())
        self.filed.append(filed)
        if self.announce:
            tag = "FLAKY" if flaky else "FOUND"
            print(f"{tag} {signature} reproduced {rate} -> {path} (minimized to {small.size()[0]} requests, "
                  f"{small.size()[2]} tokens in {seconds:.1f}s)", flush=True)
        return filed
