#!/usr/bin/env bash
# Runs the whole CPU test suite (Triton kernels under TRITON_INTERPRET=1) on two worker processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
