#!/usr/bin/env bash
# Main job: compile a tiny transformers DeepseekV32ForCausalLM (indexers with a trained geometry)
# with backend="pulsar_dosa", run it on 1024 tokens, and print the report: rewrites per layer,
# exactness against eager, the queries that took the certified path and the keys it pruned.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python scripts/demo.py "$@"
