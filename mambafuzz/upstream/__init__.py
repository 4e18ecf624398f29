"""Handing a finding to vLLM's maintainers: exported tests (standalone, V1 worker, vLLM idiom),
the candidate-fix pytest plugin."""
