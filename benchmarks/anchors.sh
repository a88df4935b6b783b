#!/usr/bin/env bash
# Issue 55's comparison on one GPU machine, from the repository root (the project installed):
#   bash benchmarks/anchors.sh [benchmarks/anchors.py arguments]
# 1. copies the anchors (ANCHORS_SRC, default .anchors: a copy of ../shared/anchors, carried) to
#    $ANCHORS_WORK/src and applies benchmarks/anchor_patches to that copy (idempotent);
# 2. builds them with the anchors' build.sh into ANCHORS_BUILD (default /tmp/anchors_build);
# 3. probes DeepGEMM's first fp8_mqa_logits call in a child process; where it fails, records why
#    (benchmarks/anchor_diag.sh: facts, a native backtrace, into $OUT/deepgemm_diag; ANCHORS_DIAG=0
#    skips it) while rebuilding DeepGEMM two other ways at once, each probed in turn, the first that
#    passes timed: with another g++ than the first build's where one exists ($ANCHORS_BUILD.syscxx),
#    and with libstdc++ linked statically, its symbols hidden and bound inside the extension
#    ($ANCHORS_BUILD.isolated);
# 4. runs benchmarks/anchors.py --out-dir $OUT (not with ANCHORS_PROBE_ONLY=1); no case starts after
#    ANCHORS_TIME_LIMIT seconds (default 450) from this script's start.
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
variant() {  # $1 = name, then VAR=value words: build DeepGEMM (FlashMLA as built) into $BUILD.$1
  local dir="$BUILD.$1"; shift
  mkdir -p "$dir"
  if [ -f "$BUILD/flashmla.stamp" ] && [ ! -f "$dir/flashmla.stamp" ]; then  # same sources: FlashMLA as built
    cp -r "$BUILD/flashmla" "$BUILD/flashmla.stamp" "$dir/"
  fi
  env "$@" OUT="$OUT/$(basename "$dir")" ANCHORS_BUILD="$dir" bash "$WORK/src/build.sh" > /dev/null 2>&1 ||
    say "the $(basename "$dir") build failed (logs in $OUT/$(basename "$dir"))"
}
# a g++ of another version than the first build's (its first compile line), where there is one
other_cxx() {
  local used; used="$(grep -m1 -o '^\[1/1\] [^ ]*' "$OUT/anchors_build_deepgemm.log" 2>/dev/null | cut -d' ' -f2)"
  [ -n "$used" ] || used="${CXX:-c++}"
  local want; want="$("$used" -dumpfullversion 2>/dev/null)"
  for c in /usr/bin/g++ /usr/bin/g++-13 /usr/bin/g++-14 /usr/bin/g++-12 /usr/bin/g++-15; do
    if [ -x "$c" ] && [ -x "${c/g++/gcc}" ] && [ "$("$c" -dumpfullversion)" != "$want" ]; then echo "$c"; return; fi
  done
}
if probe "$BUILD"; then
  EXTRA=(--no-deepgemm-probe)
else
  CXX2="$(other_cxx)"
  say "DeepGEMM's probe failed: rebuilding it ${CXX2:+with $CXX2 into $BUILD.syscxx and }with static libstdc++," \
    "hidden symbols, -Bsymbolic into $BUILD.isolated, while anchor_diag.sh looks at the failure"
  NAMES=() PIDS=()  # (a bare `wait` would also wait for the tee of this script's output)
  if [ -n "$CXX2" ]; then
    variant syscxx CXX="$CXX2" CC="${CXX2/g++/gcc}" & NAMES+=(syscxx) PIDS+=($!)
  fi
  variant isolated CFLAGS="-g -fvisibility=hidden -fvisibility-inlines-hidden" \
    LDFLAGS="-static-libstdc++ -static-libgcc -Wl,-Bsymbolic -Wl,--exclude-libs,ALL" & NAMES+=(isolated) PIDS+=($!)
  if [ "${ANCHORS_DIAG:-1}" != 0 ]; then
    bash "$ROOT/benchmarks/anchor_diag.sh" "$BUILD" "$OUT/deepgemm_diag"
    grep -A14 "segv_backtrace\] backtrace" "$OUT/deepgemm_diag/probe_preload.txt" 2>/dev/null | grep -- "->" | head -12
  fi
  wait "${PIDS[@]}"
  for name in "${NAMES[@]}"; do
    if probe "$BUILD.$name"; then
      say "DeepGEMM's probe passed in the $name build"; BUILD="$BUILD.$name"; EXTRA=(--no-deepgemm-probe); break
    fi
  done
  [ ${#EXTRA[@]} -eq 0 ] && say "DeepGEMM's probe failed in every build: anchors.py records why and times the rest"
fi
if [ "${ANCHORS_PROBE_ONLY:-0}" = 1 ]; then
  say "ANCHORS_PROBE_ONLY=1: no benchmark"; exit 0
fi

BUDGET=$(( LIMIT - ($(date +%s) - START) ))
[ "$BUDGET" -lt 30 ] && BUDGET=30
say "benchmark: build $BUILD, $BUDGET s until no case starts"
export DG_JIT_CACHE_DIR="$BUILD/dg_jit_cache"
PYTHONFAULTHANDLER=1 "$PY" "$ROOT/benchmarks/anchors.py" --anchors-build "$BUILD" --out-dir "$OUT" \
  --budget-s "$BUDGET" "${EXTRA[@]}" "$@"
say "done (exit status $?)"
