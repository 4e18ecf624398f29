#!/bin/bash -eu
# Build mambafuzz's atheris targets (mambafuzz/search/targets/fuzz_*.py) and their seed corpus zips.
#
# Inside ClusterFuzzLite/OSS-Fuzz ($SRC, $OUT set by the builder image): installs the project
# with the CPU vLLM, bundles each target with compile_python_fuzzer, and zips the seeds.
#
# Locally, without Docker: DRY_RUN=1 bash .clusterfuzzlite/build.sh
#   uses this checkout and the installed packages, writes $OUT (default out/cflite), produces
#   the seed corpus zips, and checks each target starts and runs 100 inputs.
cd "${SRC:-$(cd "$(dirname "$0")/.." && pwd)}/mambafuzz" 2>/dev/null || cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out/cflite}
mkdir -p "$OUT"
if [ "${DRY_RUN:-0}" != "1" ]; then
  pip3 install '.[cpu,fuzz]'
  pip3 uninstall -y torchvision torchaudio torchcodec || true
fi
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
pathlib.Path(out + ".tmp").rename(out)
print(f"{out}: {n} seed inputs")
PY
  if [ "${DRY_RUN:-0}" = "1" ]; then
    work=$(mktemp -d)
    MAMBAFUZZ_FINDINGS="$work/findings" MAMBAFUZZ_SPLIT=fixed "$fuzzer" "$work" -runs=100 -seed=1 \
      > "$OUT/${name}.dryrun.log" 2>&1 || { tail -20 "$OUT/${name}.dryrun.log"; exit 1; }
    grep -E "^Done [0-9]+ runs" "$OUT/${name}.dryrun.log"
    rm -rf "$work"
  else
    compile_python_fuzzer "$fuzzer" --collect-all vllm --collect-all mambafuzz --add-data mambafuzz/tiny_model:mambafuzz/tiny_model
  fi
done
echo "build.sh: ok ($OUT)"
