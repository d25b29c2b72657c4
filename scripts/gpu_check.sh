#!/usr/bin/env bash
# One GPU acceptance command: the CUDA checks (Triton kernel vs the PyTorch path, compiled steps with
# CUDA graphs vs eager, the slot bound on CUDA) and the GPU benchmarks, ending with one summary table
# (docs/performance.md). Options: scripts/gpu_check.py --help.
set -uo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
