# Sourced by the ci/ scripts: use the project's virtual environment (made by ci/setup.sh)
# without requiring it to be activated, so `python3` and `mambafuzz` below are the ones that
# have vLLM.  MAMBAFUZZ_VENV names another environment; with none, PATH is left as it is.
_venv=${MAMBAFUZZ_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv}
if [ -x "$_venv/bin/python" ]; then export PATH="$_venv/bin:$PATH"; fi
unset _venv
