"""The input model: scenarios, their decoding from fuzzer bytes, their generation, step plans. Imports no vLLM."""
