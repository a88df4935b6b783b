#!/usr/bin/env bash
# Train the measuring models on one GPU in three calls of at most 9 minutes, results under $OUT.
#   part 1: dense pretraining of the DSA model and of the Llama model, side by side;
#   part 2 (ckpt/llama from part 1): more dense training of the Llama model (both phases again),
#           then Pulsar's accuracy with it (benchmarks/pulsar_accuracy.py);
#   part 3 (ckpt/dsa-dense from part 1; the Llama model of part 2 saved as benchmarks/models/tiny-llama): the DSA indexer
#           warm-up and sparse stage, the evidence (benchmarks/models/tiny_eval.py), the trained zoo cells.
# Checkpoints go to ckpt/ and come back as ckpt.tar.* (15 MB pieces: cat ckpt.tar.* | tar x).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/tiny_out}
mkdir -p "$OUT" ckpt
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
case "${1:?part 1 or 2}" in
  1)
    python3 benchmarks/models/train_tiny_dsa.py --stage dense --model llama --out ckpt/llama --budget-s 250 130 \
      > "$OUT/llama_dense.log" 2>&1 &
    python3 benchmarks/models/train_tiny_dsa.py --stage dense --model dsa --out ckpt/dsa-dense --budget-s 280 150 \
      2>&1 | tee "$OUT/dsa_dense.log" | grep -E '"(decided_steps|start|end|saved)"|step": [0-9]*00,|Error|error'
    wait
    tar cf - ckpt | split -b 15M - "$OUT/ckpt.tar."
    ;;
  2)
    R="$OUT/results"; mkdir -p "$R"
    python3 benchmarks/models/train_tiny_dsa.py --stage dense --model llama --init ckpt/llama --out ckpt/llama-final \
      --budget-s 60 140 > "$R/llama_dense_more.log" 2>&1
    python3 benchmarks/pulsar_accuracy.py --model ckpt/llama-final --out "$R/pulsar_accuracy_h200.json" --budget-s 120 \
      > "$R/pulsar_accuracy.log" 2>&1
    tar cf "$OUT/results.tar" -C "$OUT" results
    tar cf - ckpt/llama-final | split -b 15M - "$OUT/ckpt.tar."
    ;;
  3)
    R="$OUT/results"; mkdir -p "$R"
    python3 benchmarks/models/train_tiny_dsa.py --stage indexer --model dsa --init ckpt/dsa-dense --out ckpt/dsa \
      --budget-s ${WARMUP_S:-50} ${SPARSE_S:-80} 2>&1 | tee "$R/dsa_indexer.log" \
      | grep -E '"(decided_steps|start|end|saved)"|step": [0-9]*0,|Error|error'
    tar cf - ckpt/dsa | split -b 15M - "$OUT/ckpt.tar."
    timeout ${EVAL_S:-70} python3 benchmarks/models/tiny_eval.py --dsa ckpt/dsa --llama benchmarks/models/tiny-llama \
      --out "$R/tiny_models_h200.json" --trials 20 --sparse-trials 6 --mass-windows 1 2>&1 | grep -v "Loading weights" \
      | tee "$R/tiny_eval.log"
    if [ "${ZOO_S:-50}" -gt 0 ]; then
      rm -rf benchmarks/models/tiny-dsa && cp -r ckpt/dsa benchmarks/models/tiny-dsa
      PYTHONPATH=. timeout ${ZOO_S:-50} python3 benchmarks/indexer_zoo.py --out "$R/indexer_zoo_trained_h200.json" \
        --families --trained-layers 2 0 4 --S 4096 --T 65536 --cal-T 32768 --budget-s 25 2>&1 \
        | grep -v "Loading weights" | tail -25
    fi
    ;;
esac
