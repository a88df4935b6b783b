#!/usr/bin/env bash
# Runs the whole CPU test suite (Triton kernels under TRITON_INTERPRET=1) on two worker processes,
# then the pass tests again under the oldest transformers pyproject.toml accepts (scripts/setup.sh
# installs it in .transformers-min/): the passes match transformers' code, which changes between
# releases. With arguments: pytest with those arguments only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
if [ $# -eq 0 ]; then
  export PYTHONPATH="$PWD/.transformers-min${PYTHONPATH:+:$PYTHONPATH}"
  echo "pass tests under transformers $(python -c 'import transformers; print(transformers.__version__)')"
  python -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist loadfile tests/passes
fi
