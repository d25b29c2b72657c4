#!/usr/bin/env bash
# Fill .whl/ with the wheels scripts/gpu_check.sh needs on a GPU machine that has torch, triton,
# transformers and pytest but no network (nor omegaconf, hydra-core, antlr4, platformdirs): run it
# here, where pip reaches PyPI, then carry .whl/ to that machine (it is git-ignored). All are pure
# Python; the versions are this environment's, so the GPU machine runs what the tests run here.
# gpu_check installs them with `pip install --no-index --no-deps --target <temp dir>`: torch and
# everything else already there stay untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
version() { "$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null || echo "$2"; }
omegaconf=$(version omegaconf 2.3.0)
hydra=$(version hydra-core 1.3.2)
antlr=$(version antlr4-python3-runtime 4.9.3)
platformdirs=$(version platformdirs 4.3.6)

rm -rf .whl && mkdir -p .whl
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
  --platform any -d .whl "omegaconf==$omegaconf" "hydra-core==$hydra" "platformdirs==$platformdirs"
# antlr4-python3-runtime (omegaconf's parser) is published as a source archive only: build its wheel.
"$py" -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==$antlr"
ls -1 .whl
