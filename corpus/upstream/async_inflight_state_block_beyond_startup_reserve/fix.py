"""Candidate fix: under async scheduling, the start-up check reserves the mamba state block a
request keeps for each batch in flight.

Why: since vllm-project/vllm#33997 `allocate_slots` frees skipped mamba blocks on the processed-token
basis (`remove_skipped_blocks(..., total_computed_tokens - request.num_in_flight_tokens)`,
v1/core/kv_cache_manager.py:555-557 in 0.32.0), so while a prefill chunk is in flight a request
holds one state column more per mamba group than synchronously, and the in-flight chunk's
prefill checkpoint blocks with it. `MambaSpec.max_memory_usage_bytes`
(v1/kv_cache_interface.py:1076-1080) still reserves `2 + num_speculative_blocks +
num_prefill_checkpoint_blocks` pages, the synchronous figure, and the start-up check
(`get_kv_cache_configs`, per KV-cache group) and the admission estimate read it. The wrap adds `1 +
num_prefill_checkpoint_blocks` pages per batch that can be in flight behind the one being
scheduled (one; a pipeline's stages under V2).
"""

from __future__ import annotations

from mambafuzz.sim.patching import Wrap

TARGET = "vllm.v1.kv_cache_interface:MambaSpec.max_memory_usage_bytes"


def _reserve_in_flight_column(original):
    def max_memory_usage_bytes(self, vllm_config):
        need = original(self, vllm_config)
        if vllm_config.cache_config.mamba_cache_mode == "align" and vllm_config.scheduler_config.async_scheduling:
            in_flight = max(1, vllm_config.parallel_config.pipeline_parallel_size)
            need += self.page_size_bytes * in_flight * (1 + self.num_prefill_checkpoint_blocks)
        return need
    return max_memory_usage_bytes


PATCHES = [Wrap(TARGET, _reserve_in_flight_column)]
