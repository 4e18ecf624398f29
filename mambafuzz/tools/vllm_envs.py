"""The Python environments that hold a vLLM to test against, found without importing vLLM
here: the current one, `.venv-vllm-*` in the checkout (made by `ci/setup.sh --vllm`), `.vllm-pr*`
there (made by `ci/pr-overlay`),
and whatever MAMBAFUZZ_VLLM_ENVS lists (os.pathsep-separated). Each entry there is a virtual
environment, a directory of virtual environments (e.g. /work/venvs), or an overlay directory
made by `ci/pr-overlay` (a `vllm/` package run with the current interpreter, first on the path)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ENVS_VAR = "MAMBAFUZZ_VLLM_ENVS"


@dataclass(frozen=True)
class VllmEnv:
    name: str  # a label: the directory name without its `.venv-`/`vllm-` prefix, or "current"
    python: str
    overlay: str | None = None  # a directory to put first on PYTHONPATH (a vLLM source-tree overlay)
    extra_env: dict[str, str] = field(default_factory=dict, hash=False)
    inherit_path: bool = False  # keep this process's PYTHONPATH (the current env: an overlay sourced from env.sh)

    def environ(self) -> dict[str, str]:
        """The environment a command runs with: the overlay first, the checkout importable; another
        environment's vLLM must not be shadowed by an overlay this process was started with."""
        env = dict(os.environ)
        inherited = env.get("PYTHONPATH", "").split(os.pathsep) if self.inherit_path else []
        paths = ([self.overlay] if self.overlay else []) + [p for p in inherited if p] + [str(PROJECT_ROOT)]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.update(self.extra_env)
        return env

    def run_cli(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run([self.python, "-m", "mambafuzz.cli.main", *args], env=self.environ(), cwd=PROJECT_ROOT,
                              capture_output=True, text=True, timeout=timeout)


def _label(path: Path) -> str:
    name = path.name
    for prefix in (".venv-vllm-", "vllm-", ".venv-", "."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _as_env(path: Path) -> VllmEnv | None:
    python = path / "bin" / "python"
    if python.is_file() and os.access(python, os.X_OK):
        return VllmEnv(_label(path), str(python))
    if (path / "vllm" / "__init__.py").is_file():  # an overlay: the PR's tree over this env's compiled vLLM
        return VllmEnv(_label(path), sys.executable, overlay=str(path), extra_env={"VLLM_TARGET_DEVICE": "cpu"})
    return None


def discover(extra: str | None = None, root: Path = PROJECT_ROOT) -> list[VllmEnv]:
    """The current environment first, then the others, each once (by resolved path)."""
    envs = [VllmEnv("current", sys.executable, inherit_path=True)]
    candidates = sorted(root.glob(".venv-vllm-*")) + sorted(root.glob(".vllm-pr*"))
    for entry in filter(None, (os.environ.get(ENVS_VAR, "") if extra is None else extra).split(os.pathsep)):
        p = Path(entry)
        if _as_env(p) is not None:
            candidates.append(p)
        elif p.is_dir():
            candidates.extend(sorted(c for c in p.iterdir() if c.is_dir()))
    seen = {Path(sys.executable).resolve().parent.parent}
    for c in candidates:
        env = _as_env(c)
        key = c.resolve()
        if env is None or key in seen:
            continue
        seen.add(key)
        envs.append(env)
    return envs
