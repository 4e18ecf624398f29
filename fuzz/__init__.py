"""mambafuzz: a differential fuzzer for vLLM's hybrid-model (mamba "align" mode) prefix cache.

The package is grouped by what each part does, and so by whether it touches vLLM. Data flows
one way: model -> sim -> checks -> search/store, with the CLI on top.

- `fuzz.model`: the input model (scenarios, decoding fuzzer bytes, generation, step plans).
  Imports no vLLM.
- `fuzz.sim`: the simulation. `sim.vllm_compat` is the one place vLLM is imported; the bridge,
  the harness that drives vLLM's real scheduler, and the simulated model runner (runner
  bookkeeping, mixer kernels, kernel model, worker mirror) that stands in for the GPU.
- `fuzz.checks`: the oracles over a trace, the evaluation pipeline, attribution by candidate
  fixes, the block auditor, and the conformance tier (which calls vLLM's worker code on CPU).
- `fuzz.search`: campaigns (supervisor, worker protocol and runtimes, fuzz targets, scoped
  instrumentation), the minimizer, the coverage map and planted bugs.
- `fuzz.store`: corpus files, findings, known bugs and their fixes, reports and exported tests.
- `fuzz.engine_tier`: real vLLM engines on CPU (end-to-end confirmation, the audit plugin).
- `fuzz.cli`: the `mambafuzz` command and the CI helpers.
- `fuzz.exit_codes`: the exit codes and error types every part shares.
"""
