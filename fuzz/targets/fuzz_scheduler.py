#!/usr/bin/env python3
"""atheris target: libFuzzer mutates bytes, the shared input model decodes them into a
scenario, and vLLM's real scheduler runs it.  Coverage comes from vLLM's scheduling and
KV-cache modules and from our own decoder.  Run directly with libFuzzer flags, e.g.
    fuzz/targets/fuzz_scheduler.py CORPUS_DIR -max_total_time=60
or through `mambafuzz fuzz --engine atheris`.  Set MAMBAFUZZ_DECODER=hypothesis to decode
with the Hypothesis strategy instead (what `--engine hypothesis` does)."""

import os
import sys

import atheris

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

with atheris.instrument_imports(include=["vllm.v1.core", "vllm.v1.kv_cache_interface", "fuzz.generate"]):
    from fuzz.target_runtime import Runtime

RUNTIME = Runtime.from_env()


def TestOneInput(data: bytes) -> None:
    RUNTIME.test_one_input(data)


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
