"""The simulation, by job: `bridge` (the one place vLLM is imported, `bridge.vllm_compat`, and the
bridge that builds vLLM's configs and scheduler and reads its tables), `engine` (the engine-core
loop: the harness that drives vLLM's real scheduler, the batch queue, the scripted KV connector, the
chunk splits under test, the cache audit), `worker` (the simulated model runner that stands in for
the GPU: runner rules, mixer kernels, kernel model, worker mirror and tables). At this level sit
the vocabulary all three and the layers above share (`state`: model states; `trace`: what a run
records), `patching` (fixes applied to vLLM, imported by the bridge, the search and the corpus's
fix files), and `divergence`."""
