#!/usr/bin/env bash
# Creates .venv with the CPU build of torch and this package with its test extras; a second run
# with nothing changed (same pyproject.toml, this script, Python and torch index) does nothing.
#
# PyPI's torch wheel for Linux is the multi-GB CUDA build, so the torch wheel alone is fetched
# from PyTorch's CPU wheel index (TORCH_INDEX_URL overrides it, e.g. with a CUDA index); its
# dependencies and everything else come from the usual index. A matching torch wheel that pip
# finds locally (its find-links) serves as well: where the CPU index cannot be reached, pip warns
# and takes that wheel, and fails when there is none.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.pulsar_dosa_installed
wanted=$( (cat pyproject.toml scripts/setup.sh; python -VV; echo "$TORCH_INDEX_URL"; pwd) | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && [ -d .transformers-min/transformers ]; then
  exit 0
fi
python -m pip install -q --upgrade pip
if ! python -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  wheels=$(mktemp -d)
  python -m pip download -q --no-deps "torch==2.13.0" --index-url "$TORCH_INDEX_URL" -d "$wheels"
  python -m pip install -q "$wheels"/torch-*.whl
  rm -r "$wheels"
fi
python -m pip install -q "triton==3.6.0"
python -m pip install -q -e ".[test]"  # numpy < 2.4 with it (pyproject.toml: the interpreter needs it)
# The oldest transformers pyproject.toml accepts, with what it needs that the venv holds in another
# version (pip's resolution against the venv), in a folder of its own: scripts/test.sh runs the pass
# tests again with it first on PYTHONPATH.
oldest=$(python -c 'import re; print(re.search(r"\"transformers>=([0-9.]+)", open("pyproject.toml").read()).group(1))')
rm -rf .transformers-min
python -m pip install -q --dry-run --report .transformers-min.json "transformers==$oldest"
python -m pip install -q --no-deps --target .transformers-min $(python -c '
import json
print(" ".join(p["metadata"]["name"] + "==" + p["metadata"]["version"] for p in json.load(open(".transformers-min.json"))["install"]))')
rm .transformers-min.json
echo "$wanted" > "$stamp"
