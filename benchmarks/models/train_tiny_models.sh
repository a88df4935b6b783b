#!/usr/bin/env bash
# Train the measuring models on one GPU in calls of at most 9 minutes, results under $OUT.
#   part 1: dense pretraining of the DSA model and of the Llama model, side by side;
#   part 2 (ckpt/llama from part 1): more dense training of the Llama model (both phases again),
#           then Pulsar's accuracy with it (benchmarks/pulsar_accuracy.py as it was then);
#   part 3 (ckpt/dsa-dense from part 1; the Llama model of part 2 saved as benchmarks/models/tiny-llama): the DSA indexer
#           warm-up and sparse stage, the evidence (benchmarks/models/tiny_eval.py), the trained zoo cells.
#   part 4 (benchmarks/models/tiny-llama; ckpt/llama-64k from an earlier part-4 call, if any): the Llama model's
#           curriculum to 65536 tokens (train_long_context.py), resumed where the last call stopped; once every
#           phase is done, its evidence at 16K/32K/64K (tiny_eval.py without --dsa). Two calls: the first stops
#           at its deadline (DEADLINE_S, 470 s) before the last phase, the second ends it and evaluates.
#   part 5 (ckpt/llama-64k copied to benchmarks/models/tiny-llama): benchmarks/pulsar_accuracy.py at 32K and 64K.
#   corpus DOCS (a CPU, once): .corpus/ under the committed tokenizer from python3.11-doc extracted at DOCS, and
#           .corpus/train.npy.xz (3.5 MB, what a call carries; parts 1-4 unpack it when train.npy is missing).
# Checkpoints go to ckpt/ and come back as ckpt.tar.* (15 MB pieces: cat ckpt.tar.* | tar x). Results of parts 4
# and 5 are named for the GPU (TAG, default h100).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/tiny_out}
TAG=${TAG:-h100}
export PYTHONUNBUFFERED=1
if [ "${1:-}" = corpus ]; then
  python3 benchmarks/models/tiny_corpus.py --docs "${2:?corpus DOCS: python3.11-doc extracted with dpkg -x}" \
    --out .corpus --tokenizer benchmarks/models/tokenizer --reuse-tokenizer
  python3 -c 'import lzma, shutil; shutil.copyfileobj(open(".corpus/train.npy", "rb"), lzma.open(".corpus/train.npy.xz", "wb", preset=9))'
  exit
fi
mkdir -p "$OUT" ckpt
if [ ! -f .corpus/train.npy ] && [ -f .corpus/train.npy.xz ]; then
  python3 -c 'import lzma, shutil; shutil.copyfileobj(lzma.open(".corpus/train.npy.xz"), open(".corpus/train.npy", "wb"))'
fi
python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
case "${1:?part 1, 2, 3, 4, 5 or corpus}" in
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
  4)
    R="$OUT/results"; mkdir -p "$R"
    python3 benchmarks/models/train_long_context.py --out ckpt/llama-64k --deadline-s ${DEADLINE_S:-470} \
      > "$R/llama_long.log" 2>&1
    rc=$?
    grep -E '"(start|decided_steps|stopped_at_step|saved|paused_before|end)"|Error|error' "$R/llama_long.log" | cut -c1-400
    tar cf - ckpt/llama-64k | split -b 15M - "$OUT/ckpt.tar."
    if [ $rc -eq 0 ]; then
      timeout ${EVAL_S:-150} python3 benchmarks/models/tiny_eval.py --llama ckpt/llama-64k --loss-lengths 16384 32768 65536 \
        --loss-windows 6 --retrieval-lengths 32768 65536 --trials 100 --out "$R/tiny_llama_64k_$TAG.json" 2>&1 \
        | grep -v "Loading weights" | tee "$R/tiny_eval.log"
    fi
    ;;
  5)
    R="$OUT/results"; mkdir -p "$R"
    python3 benchmarks/pulsar_accuracy.py --model benchmarks/models/tiny-llama --out "$R/pulsar_accuracy_64k_$TAG.json" \
      --budget-s ${BUDGET_S:-400} 2>&1 | grep -v "Loading weights" | tee "$R/pulsar_accuracy.log"
    ;;
esac
