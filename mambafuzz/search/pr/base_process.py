"""The PR job's base: a second process that runs the vLLM a pull request is based on and says
how each scenario fails there, so a finding fails the PR only when its base does not show it.

A finding is a symptom and a known bug's fix is a guess at its cause: judging a PR by "a known
fix makes it clean" hid a new bug on a path a known fix also touches (the hash-grid split bug,
clean under the internal-checkpoint fix).  ClusterFuzzLite's PR mode asks the sounder question:
does the crash reproduce on the base build?  The base is another vLLM tree, which cannot share a
process with the PR's, so it runs here, behind one narrow interface: a scenario in (one JSON
line on stdin), its signature under the split out (`{"signature": S}`, null when clean;
`{"rejected": why}` when the base cannot run the scenario; `{"error": why}` when mambafuzz
failed on it there). A line `{"observe": scenario}` asks instead what the scenario's cached run
shows there (`{"observed": ...}`, mambafuzz.search.pr.divergence), for the findings' divergence keys;
With the conform target (`conform_runners`), a scenario's signature is its first disagreement
between the kernel model and vLLM's worker code there (mambafuzz.conform.target).
`{"figures": scenario}` asks for its cached run's resource figures (`{"figures": {...}}`,
`Trace.resource_figures`; null when the base cannot run it), for the efficiency gate
(mambafuzz.search.pr.efficiency_gate).

`where` names the base: `installed` (the vLLM installed in this interpreter's environment, with
no overlay on PYTHONPATH and no planted mutant) or a directory made by `ci/pr-overlay` (it holds
`vllm/`).  Known fixes the campaign applies (`--with-known-fixes`) apply to the base too, so the
two sides differ by the PR alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mambafuzz.exit_codes import ToolError, UsageError, one_line

INSTALLED = "installed"
ROOT = Path(__file__).resolve().parents[3]


def check_where(where: str) -> str:
    """`where` as the base process will use it; a one-line UsageError when it names no vLLM."""
    if where == INSTALLED:
        return where
    path = Path(where)
    if not (path / "vllm" / "__init__.py").is_file():
        raise UsageError(f"--base {where}: not 'installed' nor a directory holding vllm/ (make one with ci/pr-overlay)")
    return str(path.resolve())


def base_env(where: str) -> dict[str, str]:
    """The environment of the base process: this one without the PR's overlay or planted bug."""
    from mambafuzz.search.worker_protocol import CONFIG_ENV

    env = {k: v for k, v in os.environ.items() if k not in ("MAMBAFUZZ_MUTANT", CONFIG_ENV)}
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    if where != INSTALLED:
        env["PYTHONPATH"] += os.pathsep + where
        env["VLLM_TARGET_DEVICE"] = "cpu"  # as ci/pr-overlay's env.sh: a source tree cannot infer it
    return env


class BaseProcess:
    """The client: starts the base process at once (it imports vLLM while the worker fuzzes) and
    asks it one scenario at a time."""

    def __init__(self, where: str, split: str, known_fix_dirs: list[str] | None = None,
                 conform_runners: list[str] | None = None):
        """`conform_runners`: the base judges a scenario as the conform target does on those runners
        (its first disagreement's signature) instead of by the oracles."""
        self.where = where
        settings = json.dumps({"split": split, "known_fix_dirs": list(known_fix_dirs or []),
                               "conform_runners": conform_runners})
        self.proc = subprocess.Popen([sys.executable, "-m", "mambafuzz.search.pr.base_process", settings],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=base_env(where), text=True, bufsize=1)

    def _send(self, request) -> None:
        if self.proc.poll() is not None:
            raise ToolError(f"the base process ({self.where}) exited {self.proc.returncode}")
        self.proc.stdin.write(json.dumps(request if isinstance(request, dict) else json.loads(request.dumps())) + "\n")
        self.proc.stdin.flush()

    def _receive(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise ToolError(f"the base process ({self.where}) exited {self.proc.wait()} without an answer")
        return json.loads(line)

    def _ask(self, request) -> dict:
        self._send(request)
        return self._receive()

    def figures_begin(self, scenario) -> None:
        """Ask for `scenario`'s resource figures on the base (`Trace.resource_figures`)
        and return at once: the base runs it while this process runs its own side."""
        self._send({"figures": json.loads(scenario.dumps())})

    def figures_end(self) -> dict | None:
        """The answer to the last `figures_begin`; None when the base cannot run the scenario."""
        answer = self._receive()
        if "error" in answer:
            raise ToolError(f"on the base ({self.where}): {answer['error']}")
        return answer.get("figures")

    def signature_of(self, scenario) -> str | None:
        """How `scenario` fails on the base (None: clean); a base that cannot run it answers
        `rejected: ...`, which no finding's signature equals."""
        answer = self._ask(scenario)
        if "error" in answer:
            raise ToolError(f"on the base ({self.where}): {answer['error']}")
        if "rejected" in answer:
            return f"rejected: {answer['rejected']}"
        return answer["signature"]

    def observed(self, scenario) -> dict | None:
        """What `scenario`'s cached run shows on the base (mambafuzz.search.pr.divergence.observed);
        None when the base cannot run it."""
        answer = self._ask({"observe": json.loads(scenario.dumps())})
        if "error" in answer:
            raise ToolError(f"on the base ({self.where}): {answer['error']}")
        return answer.get("observed")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def cached_run(scenario, split: str, patches=()):
    """`scenario`'s cached run (its own runner) under `split` and `patches`: what the base runs for
    `observe` and `figures`, so both sides of a comparison are computed alike."""
    from mambafuzz.model.scenario import with_runner
    from mambafuzz.sim import patching
    from mambafuzz.sim.engine import harness, splits

    with patching.applied(patches):
        return harness.run(with_runner(scenario, None), splits.resolve(split), split)


def observe(scenario, split: str, patches=()) -> dict:
    """What `scenario`'s cached run shows under `split` (and `patches`), as the base answers
    `observe`: the two sides of a divergence key are computed alike."""
    from mambafuzz.search.pr.divergence import observed

    return observed(cached_run(scenario, split, patches))


def divergence_keys(found: list, split: str, patches, base: BaseProcess) -> dict:
    """Each finding's divergence key (mambafuzz.search.pr.divergence.key) by its path: its minimized case
    run here (the PR's vLLM, `patches`) and on `base`; None where either side cannot run it."""
    from mambafuzz.model.scenario import ScenarioError
    from mambafuzz.search.pr.divergence import key

    keys = {}
    for m in found:
        try:
            theirs = base.observed(m.scenario)
            keys[m.path] = None if theirs is None else key(observe(m.scenario, split, patches), theirs)
        except (ScenarioError, ToolError):
            keys[m.path] = None
    return keys


def serve(settings: dict) -> int:
    from mambafuzz.checks.pipeline import evaluate
    from mambafuzz.model.scenario import ScenarioError, loads
    from mambafuzz.search.startup import prepare_process

    conform_runners = settings.get("conform_runners")
    # no planted bug: base_env drops it; the conformance tier needs Triton's CPU shim first
    prepare_process(known_fix_dirs=settings.get("known_fix_dirs", []), conform=conform_runners is not None)
    split = settings["split"]
    if conform_runners is not None:
        from mambafuzz.conform import target as conform_target

        def signature(s):
            v = conform_target.verdict(s, conform_runners)
            return None if v is None else v.signature
    else:
        def signature(s):
            verdict = evaluate(s, split, efficiency=False).verdict
            return None if verdict.clean else verdict.primary.signature
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if isinstance(request, dict) and "figures" in request:
                answer = {"figures": cached_run(loads(json.dumps(request["figures"])), split).resource_figures()}
                sys.stdout.write(json.dumps(answer) + "\n")
                sys.stdout.flush()
                continue
            if isinstance(request, dict) and "observe" in request:
                sys.stdout.write(json.dumps({"observed": observe(loads(json.dumps(request["observe"])), split)}) + "\n")
                sys.stdout.flush()
                continue
            answer = {"signature": signature(loads(line))}
        except ScenarioError as exc:
            answer = {"rejected": "; ".join(exc.problems)}
        except Exception as exc:  # noqa: BLE001 - the worker counts it as a tool failure on this input
            answer = {"error": one_line(exc, where=True)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve(json.loads(sys.argv[1])))
