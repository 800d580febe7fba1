#!/usr/bin/env bash
# Creates .venv and installs rmsnorm with every extra, without ever pulling a CUDA build of torch on a
# machine that has no NVIDIA GPU. An already-installed torch (>= 2.7) is reused.
set -euo pipefail
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_PIN=${TORCH_PIN:-2.13.0}
# The lock: every other package at its tested version. CONSTRAINTS= (empty) installs the newest
# releases the package's ranges admit instead (make test-latest).
CONSTRAINTS=${CONSTRAINTS-constraints.txt}
cd "$(dirname "$0")/.."

has_torch='import sys, torch; v = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(v < (2, 7))'

if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c "$has_torch" 2>/dev/null; then
    echo "setup: reusing the torch installed for $PY"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)

if ! "$VENV/bin/python" -c "$has_torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: NVIDIA GPU found, installing torch==$TORCH_PIN (CUDA build)"
    "${pip[@]}" install "torch==$TORCH_PIN"
  elif "${pip[@]}" install -q --no-index --no-deps "torch==$TORCH_PIN" 2>/dev/null; then
    # A local wheel (pip's find-links) satisfied the pin without the network; now its dependencies.
    echo "setup: installed torch==$TORCH_PIN from a local wheel"
    "${pip[@]}" install -q "torch==$TORCH_PIN"
  else
    echo "setup: no GPU, installing the CPU build of torch==$TORCH_PIN"
    "${pip[@]}" install "torch==$TORCH_PIN" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
fi

lock=()
if [ -n "$CONSTRAINTS" ]; then lock=(-c "$CONSTRAINTS"); fi
"${pip[@]}" install -q "${lock[@]}" -e ".[all,dev]"
# Compile the CPU kernels now (~15 s, cached next to the package) rather than on the first CPU op.
"$VENV/bin/python" -m rmsnorm warmup
"$VENV/bin/python" -c "import torch, rmsnorm; print(f'setup: rmsnorm {rmsnorm.__version__}, torch {torch.__version__}')"
