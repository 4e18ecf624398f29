#!/usr/bin/env python3
"""atheris target: libFuzzer mutates bytes, the shared input model decodes them into a
scenario, vLLM's real scheduler runs it, and the WorkerConfig's target judges it (the oracles,
or with `target: conform` the kernel model against vLLM's own worker code).

Coverage feedback comes from vLLM's scheduling and KV-cache modules (`vllm.v1.core.*`,
`vllm.v1.kv_cache_interface`) and from our decoders, plus for the conform target the kernel
model and the conformance tier, and from nothing else (mambafuzz.search.instrumentation explains why
atheris' own import hook cannot do that).  Run it with the
interpreter that has vLLM, with libFuzzer flags, e.g.
    .venv/bin/python mambafuzz/search/targets/fuzz_scheduler.py CORPUS_DIR -max_total_time=60
or through `mambafuzz fuzz --generator atheris|hypothesis`, which passes a WorkerConfig file
(mambafuzz.search.worker_protocol) and reads this process's JSON events.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from mambafuzz.exit_codes import one_line  # noqa: E402  (neither imports vLLM)
from mambafuzz.search.worker_protocol import emit  # noqa: E402

try:
    import atheris

    from mambafuzz.search.instrumentation import instrument_target
    from mambafuzz.search.startup import prepare_worker
    from mambafuzz.search.target_runtime import Runtime
    from mambafuzz.search.worker_protocol import WorkerConfig

    CONFIG = WorkerConfig.from_environment()
    prepare_worker(CONFIG)  # before instrumenting, so a planted bug's functions are instrumented
    INSTRUMENTED = instrument_target(CONFIG.target)
    RUNTIME = Runtime(CONFIG)
except Exception as exc:  # noqa: BLE001 - one event, then a tool-failure exit; never a "crash" finding
    emit("error", message=one_line(exc), python=sys.executable)
    sys.exit(3)


def TestOneInput(data: bytes) -> None:
    RUNTIME.test_one_input(data)


if __name__ == "__main__":
    emit("started", generator=CONFIG.generator, target=CONFIG.target, python=sys.executable,
         instrumented_functions=INSTRUMENTED)
    # --max-time counts from the campaign's start: what start-up took comes out of libFuzzer's budget
    argv = [f"-max_total_time={int(CONFIG.fuzz_seconds(float(a.split('=', 1)[1])))}"
            if a.startswith("-max_total_time=") else a for a in sys.argv]
    atheris.Setup(argv, TestOneInput)
    atheris.Fuzz()
