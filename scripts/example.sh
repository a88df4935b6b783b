#!/usr/bin/env bash
# Main job: compile a tiny transformers DeepseekV32ForCausalLM with backend="pulsar_dosa",
# run it, and print the report (rewrites per layer, exactness against eager, fallbacks).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m compiler.demo "$@"
