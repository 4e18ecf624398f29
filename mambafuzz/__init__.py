"""mambafuzz: a differential fuzzer for vLLM's hybrid-model (mamba "align" mode) prefix cache.

The package is layered; data flows one way, scenario -> engine run -> trace -> verdict ->
triage -> corpus, and each layer imports only itself and the layers listed before it (`LAYERS`
below is the order; tests/test_layers.py holds every import to it, function-local ones too):

- `mambafuzz.exit_codes`, `mambafuzz.findings`: the exit codes and error types, and the finding
  vocabulary every part shares (kinds, signatures, the oracle registry, the `Violation` a judge
  reports).
- `mambafuzz.model`: the input model (scenarios, decoding fuzzer bytes, generation, step plans).
  Imports no vLLM.
- `mambafuzz.sim`: the simulation, by job. `sim.bridge`: `sim.bridge.vllm_compat` is the one
  place vLLM is imported (with the platform shims beside it), and the bridge (configs, the
  scheduler session); `sim.engine`: the harness that drives vLLM's real scheduler through the
  engine-core loop, the scripted connector, the splits, the cache audit; `sim.worker`: the
  simulated model runner (runner bookkeeping, mixer kernels, kernel model, worker mirror) that
  stands in for the GPU. `sim.state`, `sim.trace` and `sim.patching` are shared by all three.
- `mambafuzz.store`: the database: corpus files, findings on disk (saved, fetched, listed; never
  judged), known bugs, reports.
- `mambafuzz.checks`: the oracles over a trace, the evaluation pipeline and its `Judge`,
  attribution by candidate fixes.
- `mambafuzz.conform`: the conformance tier (the kernel model held against vLLM's worker code).
- `mambafuzz.tools`: fix cost, coverage replay, vLLM environments and the version matrix,
  mutation testing (`tools.mutation`: planted and generated mutants, planting one by name,
  confirming kills, the mutation run's fork server and tables): libraries over the checks that
  campaigns (planted mutants) and exports (the fix's cost) use, so they sit below both.
- `mambafuzz.search`: campaigns (supervisor, worker protocol and runtimes, fuzz targets, scoped
  instrumentation), triage (dedup, attribution, repro, minimizing, announcing), the minimizer,
  the coverage map, PR mode (`search.pr`: the base vLLM's process, judging a finding against the
  base, the efficiency gate, divergence and grouping), and the one start-up step of a process that runs scenarios
  (`mambafuzz.search.startup.prepare_worker`: the planted bug, `--patch` fixes, known fixes,
  Triton's CPU shim). Importing a module plants, patches or enables nothing.
- `mambafuzz.engine_tier`: real vLLM engines on CPU (end-to-end confirmation, the audit plugin).
- `mambafuzz.upstream`: exported tests and reports for vLLM's maintainers.
- `mambafuzz.cli`: the `mambafuzz` command and the CI helpers.
"""

# The layers, lowest first: a module may import its own layer and the layers before it, never a
# later one. Each entry names top-level modules or subpackages of `mambafuzz`.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("exit_codes", "findings"),
    ("model",),
    ("sim",),
    ("store",),
    ("checks",),
    ("conform",),
    ("tools",),
    ("search",),
    ("engine_tier",),
    ("upstream",),
    ("cli",),
)
