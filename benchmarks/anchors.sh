#!/usr/bin/env bash
# Issue 55's comparison on one GPU machine, from the repository root (the project installed):
#   bash benchmarks/anchors.sh [benchmarks/anchors.py arguments]
# 1. copies the anchors (ANCHORS_SRC, default .anchors: a copy of ../shared/anchors, carried) to
#    $ANCHORS_WORK/src and applies benchmarks/anchor_patches to that copy (idempotent);
# 2. builds them with the anchors' build.sh into ANCHORS_BUILD (default /tmp/anchors_build);
# 3. probes DeepGEMM's first fp8_mqa_logits call in a child process; where it fails, rebuilds
#    DeepGEMM with its symbols bound inside the extension (-fvisibility=hidden, -Bsymbolic) into
#    $ANCHORS_BUILD.isolated and probes that;
# 4. runs benchmarks/anchors.py --out-dir $OUT; no case starts after ANCHORS_TIME_LIMIT seconds
#    (default 450) from this script's start.
# Output under $OUT: anchors_<device>.json and .md, the build logs, and everything printed in $OUT/log.
set -u
START=$(date +%s)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OUT="${OUT:-$ROOT/anchors_out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
SRC_IN="${ANCHORS_SRC:-$ROOT/.anchors}"
WORK="${ANCHORS_WORK:-/tmp/anchors55}"
BUILD="${ANCHORS_BUILD:-/tmp/anchors_build}"
LIMIT="${ANCHORS_TIME_LIMIT:-450}"
PY="${PYTHON:-python3}"
PATCHES="$ROOT/benchmarks/anchor_patches"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
say() { echo "[anchors $(( $(date +%s) - START )) s] $*"; }

if [ ! -f "$SRC_IN/build.sh" ]; then
  say "no anchors at $SRC_IN: copy ../shared/anchors there (benchmarks/README.md, The public anchors)"; exit 2
fi
rm -rf "$WORK/src" && mkdir -p "$WORK" && cp -r "$SRC_IN" "$WORK/src"

# the DeepGEMM patch: text_scan.hpp added, include_parser.hpp and compiler.hpp edited (README there)
cp "$PATCHES/text_scan.hpp" "$WORK/src/deepgemm/csrc/jit/text_scan.hpp"
if patch -p1 -R --dry-run -s -f -d "$WORK/src" < "$PATCHES/deepgemm_no_regex.patch" > /dev/null 2>&1; then
  say "DeepGEMM patch: already applied"
elif patch -p1 -s -f -d "$WORK/src" < "$PATCHES/deepgemm_no_regex.patch"; then
  say "DeepGEMM patch: applied; JIT headers still using std::regex:" \
    "$(grep -l 'std::regex' "$WORK"/src/deepgemm/csrc/jit/*.hpp | grep -vc text_scan.hpp)"
else
  say "DeepGEMM patch: does not apply to these sources; building them as they are"
fi

probe() {  # $1 = build folder
  DG_JIT_CACHE_DIR="$1/dg_jit_cache" "$PY" "$ROOT/benchmarks/anchors.py" --probe-deepgemm --anchors-build "$1"
}

say "building into $BUILD"
OUT="$OUT" ANCHORS_BUILD="$BUILD" bash "$WORK/src/build.sh" || say "a build failed (logs in $OUT); timing what built"
EXTRA=()
if probe "$BUILD"; then
  EXTRA=(--no-deepgemm-probe)
else
  ISOLATED="$BUILD.isolated"
  say "DeepGEMM's probe failed: rebuilding it with hidden symbols into $ISOLATED"
  mkdir -p "$ISOLATED"
  if [ -f "$BUILD/flashmla.stamp" ] && [ ! -f "$ISOLATED/flashmla.stamp" ]; then  # same sources: FlashMLA as built
    cp -r "$BUILD/flashmla" "$BUILD/flashmla.stamp" "$ISOLATED/"
  fi
  OUT="$OUT/isolated" ANCHORS_BUILD="$ISOLATED" CFLAGS="-fvisibility=hidden -fvisibility-inlines-hidden" \
    LDFLAGS="-Wl,-Bsymbolic" bash "$WORK/src/build.sh" || say "the isolated build failed (logs in $OUT/isolated)"
  if probe "$ISOLATED"; then
    BUILD="$ISOLATED"; EXTRA=(--no-deepgemm-probe)
  else
    say "DeepGEMM's probe failed again: anchors.py records why and times the rest"
  fi
fi

BUDGET=$(( LIMIT - ($(date +%s) - START) ))
[ "$BUDGET" -lt 30 ] && BUDGET=30
say "benchmark: build $BUILD, $BUDGET s until no case starts"
export DG_JIT_CACHE_DIR="$BUILD/dg_jit_cache"
PYTHONFAULTHANDLER=1 "$PY" "$ROOT/benchmarks/anchors.py" --anchors-build "$BUILD" --out-dir "$OUT" \
  --budget-s "$BUDGET" "${EXTRA[@]}" "$@"
say "done (exit status $?)"
