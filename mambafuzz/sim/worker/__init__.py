"""The simulated model runner that stands in for the GPU: `kernel_model` (what each row reads and
writes, per runner and mixer: `runners`, `mixers`), `worker_mirror` (applies a SchedulerOutput to
the kernel models as vLLM's worker would), `worker_tables` (the block tables the worker was told),
V1's accepted-count rule asked of vLLM's own `InputBatch` (`v1_accepted_probe`, `v1_input_batch`),
and `constant_worker` (a worker with no model, for the loops that need none). It imports vLLM's
names through `bridge.vllm_compat` and the shared `state`; only `constant_worker` reads the engine
loop's batch queue and connector plan. The engine loop, the conformance tier (which holds the
kernel model against vLLM's worker code) and the runtime audit plugin import it."""
