"""The engine-core loop: `harness` plays vLLM's engine core around its real scheduler (input
queue, schedule, forward, update), checks each row against the scheduler contract
(`worker_contract`) and records the trace; `engine_core` is the batch queue (depth 1 or 2) it
shares with the model-less loops; `connector` is the scripted KV connector vLLM loads by module
path, with its worker side (`ConnectorWorker`: loads and saves in flight); `splits` are the
chunk-split functions under test; `cache_audit` and `hash_book` judge every published mamba block
and `cache_scan` picks the ones to judge each step; `pool_facts` records the pool's resources. It imports
the bridge, the worker and the shared `state` and `trace`; the checks, the search and the tiers
above import it to run a scenario."""
