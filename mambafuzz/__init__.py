"""mambafuzz: a differential fuzzer for vLLM's hybrid-model (mamba "align" mode) prefix cache.

The package is layered; data flows one way, scenario -> engine run -> trace -> verdict ->
triage -> corpus, and each layer imports only the layers listed before it:

- `mambafuzz.exit_codes`, `mambafuzz.findings`: the exit codes and error types, and the finding
  vocabulary every part shares (kinds, signatures, the oracle registry, the `Violation` a judge
  reports).
- `mambafuzz.model`: the input model (scenarios, decoding fuzzer bytes, generation, step plans).
  Imports no vLLM.
- `mambafuzz.sim`: the simulation. `sim.vllm_compat` is the one place vLLM is imported (with the
  platform shims beside it); the bridge, the harness that drives vLLM's real scheduler, the cache
  audit, and the simulated model runner (runner bookkeeping, mixer kernels, kernel model, worker
  mirror) that stands in for the GPU.
- `mambafuzz.store`: the database: corpus files, findings on disk (saved, fetched, listed; never
  judged), known bugs, reports.
- `mambafuzz.checks`: the oracles over a trace, the evaluation pipeline and its `Judge`,
  attribution by candidate fixes.
- `mambafuzz.conform`: the conformance tier (the kernel model held against vLLM's worker code).
- `mambafuzz.search`: campaigns (supervisor, worker protocol and runtimes, fuzz targets, scoped
  instrumentation), triage (dedup, attribution, repro, minimizing, announcing), the minimizer, the coverage map and planted bugs.
- `mambafuzz.engine_tier`: real vLLM engines on CPU (end-to-end confirmation, the audit plugin).
- `mambafuzz.upstream`: exported tests and reports for vLLM's maintainers.
- `mambafuzz.tools`: fix cost, coverage replay, vLLM environments and the version matrix,
  mutation testing.
- `mambafuzz.cli`: the `mambafuzz` command and the CI helpers.
"""
