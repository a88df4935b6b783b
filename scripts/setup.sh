#!/usr/bin/env bash
# Creates .venv (once) with a CPU build of torch and this package with its test extras.
# torch is pinned: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0" "triton==3.6.0" "numpy<2.4"
python -m pip install -q -e ".[test]"
