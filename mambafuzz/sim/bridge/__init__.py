"""The bridge to vLLM: `vllm_compat` is the one place vLLM is imported (each release's names, the
platform shims beside them); `configs` builds what an engine builds before its scheduler (the
`VllmConfig`, the KV-cache groups and config, the start-up budget); `scheduler_session` holds the
scheduler and gives read-only views of its block tables and prefix cache; `architectures` gives a
registered architecture's vLLM KV-cache specs. Everything above vLLM talks to these, never to vLLM
objects: the engine loop, the conformance and engine tiers, the CLI. The bridge imports only
`mambafuzz.model` and `sim.patching`, so every other part of `sim` may import it."""
