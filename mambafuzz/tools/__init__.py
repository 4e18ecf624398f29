"""Tools around the fuzzer, not part of a run: fix cost, coverage replay, vLLM environment
discovery and the version matrix, mutation testing."""
