#!/usr/bin/env bash
# Creates .venv (once) with the CPU build of torch and this package with its test extras.
#
# torch comes from PyTorch's CPU wheel index (TORCH_INDEX_URL overrides it, e.g. a CUDA index):
# PyPI's torch wheel for Linux is the multi-GB CUDA build. A torch wheel that pip finds locally
# (pip's find-links) is used as well; where the CPU index cannot be reached, pip says so in a
# warning and takes torch from such a local wheel, or fails when there is none.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0" --index-url "$TORCH_INDEX_URL"
python -m pip install -q "triton==3.6.0" "numpy<2.4"
python -m pip install -q -e ".[test]"
