#!/usr/bin/env bash
# Why DeepGEMM's probe call crashes (issue 55), on the GPU machine, which has cuda-gdb but no gdb:
#   bash benchmarks/anchor_diag.sh BUILD_DIR OUT_DIR
# BUILD_DIR is a build folder of the anchors (deepgemm/ in it), OUT_DIR gets:
#   facts.txt         the compilers, the extension's libraries and GLIBCXX needs, the libstdc++ the
#                     process loads, the GCC that built torch and the extension (.comment), the JIT cache
#   probe_preload.txt the probe (anchors.py's PROBE) with DG_JIT_DEBUG=1, C stdio unbuffered, under
#                     anchor_patches/segv_backtrace.c (LD_PRELOAD): the native backtrace at the crash,
#                     demangled, with file:line of the extension's frames (addr2line)
#   probe_gdb.txt     the same probe under cuda-gdb (bt of every thread), only where the preload gave no
#                     backtrace or ANCHORS_DIAG_GDB=1, and cuda-gdb exists
# Every step has a time limit; a missing tool is skipped with a line saying so. Exit status 0.
set -u
BUILD="$1"; DOUT="$2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
DG="$BUILD/deepgemm"
SO="$(ls "$DG"/deep_gemm/_C*.so 2>/dev/null | head -1)"
mkdir -p "$DOUT"
has() { command -v "$1" >/dev/null 2>&1; }

{
  echo "== compilers (CC=${CC:-unset} CXX=${CXX:-unset} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-unset})"
  for c in "${CXX:-}" c++ g++ /opt/gcc/bin/g++ /usr/bin/g++ /usr/bin/g++-12 /usr/bin/g++-13 /usr/bin/g++-14 /usr/bin/g++-15; do
    [ -n "$c" ] && has "$c" && echo "$c -> $(readlink -f "$(command -v "$c")"): $("$c" --version | head -1)"
  done
  for t in cuda-gdb gdb addr2line c++filt objdump readelf nm stdbuf cc; do echo "$t: $(command -v $t || echo missing)"; done
  echo "== libstdc++ copies"; ls -l /opt/gcc/lib64/libstdc++.so* /usr/lib/x86_64-linux-gnu/libstdc++.so* 2>&1
  cat /etc/ld.so.conf.d/*.conf 2>/dev/null | grep -v '^#'
  echo "== extension $SO"
  if [ -n "$SO" ]; then
    ldd "$SO" | grep -E "stdc|gcc_s|torch|c10|not found"
    readelf -p .comment "$SO" 2>/dev/null | grep -i gcc | sort -u
    echo "GLIBCXX versions needed (highest 3): $(objdump -T "$SO" | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -3 | tr '\n' ' ')"
    echo "CXXABI versions needed (highest 2): $(objdump -T "$SO" | grep -o 'CXXABI_[0-9.]*' | sort -uV | tail -2 | tr '\n' ' ')"
    echo "dynamic symbols defined by the extension, std:: ones: $(nm -D --defined-only "$SO" | c++filt | grep -c ' std::')"
    echo "  of which locale/facet/ios: $(nm -D --defined-only "$SO" | c++filt | grep -cE 'std::(locale|__cxx11::collate|collate|ctype|num_put|num_get|numpunct|basic_ios|ios_base)')"
    nm -D --defined-only "$SO" | c++filt | grep -E ' [uVW] std::.*(locale|collate|ctype|facet|numpunct|num_put)' | head -20
    echo "undefined locale/facet symbols: "; nm -D --undefined-only "$SO" | c++filt | grep -E 'locale|facet|collate|ctype' | head -20
  fi
  echo "== libstdc++ in the process after import torch, deep_gemm; GCC that built torch"
  timeout 120 "$PY" - "$DG" <<'PYEOF' 2>&1
import sys, subprocess, torch, os
sys.path.insert(0, sys.argv[1])
import deep_gemm
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libstdc++" in l or "libgcc_s" in l})
print("loaded:", libs)
for l in libs:
    if "libstdc++" in l:
        out = subprocess.run(["strings", l], capture_output=True, text=True).stdout.split()
        print(l, "highest GLIBCXX:", sorted({s for s in out if s.startswith("GLIBCXX_3.4")}, key=lambda s: [int(x) for x in s[8:].split(".") if x])[-1:])
lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
com = subprocess.run(["readelf", "-p", ".comment", lib], capture_output=True, text=True).stdout
print("libtorch_cpu .comment:", sorted({l.split("]", 1)[-1].strip() for l in com.splitlines() if "GCC" in l}))
print("torch cxx11 abi:", torch.compiled_with_cxx11_abi(), "CUDA_HOME:", os.environ.get("CUDA_HOME"), "nvcc:", subprocess.run(["which", "nvcc"], capture_output=True, text=True).stdout.strip())
PYEOF
  echo "== JIT cache of the failed probe ($BUILD/dg_jit_cache): a kernel.cubin means nvcc finished before the crash"
  find "$BUILD/dg_jit_cache" -maxdepth 4 2>/dev/null | head -20
} > "$DOUT/facts.txt" 2>&1
echo "[diag] facts: $DOUT/facts.txt"

"$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); from benchmarks.anchors import PROBE; open(sys.argv[2], "w").write(PROBE)' \
  "$ROOT" "$DOUT/probe.py"
export DG_JIT_CACHE_DIR="$BUILD/dg_jit_cache.diag" DG_JIT_DEBUG=1 DG_JIT_PRINT_COMPILER_COMMAND=1
PRELOAD_SO="$DOUT/segv_backtrace.so"
BUF=(); has stdbuf && BUF=(stdbuf -o0 -e0)
if has cc && cc -shared -fPIC -O1 -o "$PRELOAD_SO" "$ROOT/benchmarks/anchor_patches/segv_backtrace.c" 2>"$DOUT/preload_build.txt"; then
  env -u PYTHONFAULTHANDLER LD_PRELOAD="$PRELOAD_SO" timeout -k 10 300 "${BUF[@]}" "$PY" "$DOUT/probe.py" "$DG" \
    > "$DOUT/probe_preload.raw.txt" 2>&1
  echo "exit status $?" >> "$DOUT/probe_preload.raw.txt"
  # demangle, and give file:line for frames printed as lib(+0xOFF)
  "$PY" - "$DOUT/probe_preload.raw.txt" > "$DOUT/probe_preload.txt" 2>&1 <<'PYEOF'
import re, shutil, subprocess, sys
text = open(sys.argv[1], errors="replace").read()
if shutil.which("c++filt"):
    text = subprocess.run(["c++filt"], input=text, capture_output=True, text=True).stdout
out = []
for line in text.splitlines():
    out.append(line)
    m = re.match(r"^(/\S+)\(\+(0x[0-9a-f]+)\)\[0x[0-9a-f]+\]$", line)
    if m and shutil.which("addr2line"):
        where = subprocess.run(["addr2line", "-Cfpie", m.group(1), m.group(2)], capture_output=True, text=True).stdout.strip()
        out.append("    -> " + where)
print("\n".join(out))
PYEOF
  echo "[diag] probe under the preload: $(tail -1 "$DOUT/probe_preload.raw.txt"); $DOUT/probe_preload.txt"
else
  echo "[diag] no cc or the preload did not build ($DOUT/preload_build.txt)"
fi

if has cuda-gdb && { [ "${ANCHORS_DIAG_GDB:-0}" = 1 ] || ! grep -q "segv_backtrace\] backtrace" "$DOUT/probe_preload.raw.txt" 2>/dev/null; }; then
  env -u PYTHONFAULTHANDLER timeout -k 10 "${ANCHORS_DIAG_GDB_S:-180}" cuda-gdb -nx -batch \
    -ex "set pagination off" -ex "set confirm off" -ex "set print thread-events off" -ex "set width 0" \
    -ex run -ex "bt 60" -ex "info registers rip" -ex "x/6i \$pc" -ex "thread apply all bt 25" \
    -ex "info sharedlibrary" --args "$PY" "$DOUT/probe.py" "$DG" > "$DOUT/probe_gdb.txt" 2>&1
  echo "[diag] cuda-gdb: exit status $?; $DOUT/probe_gdb.txt"
else
  echo "[diag] cuda-gdb not run ($(command -v cuda-gdb || echo missing); the preload gave a backtrace unless said above)"
fi
exit 0
