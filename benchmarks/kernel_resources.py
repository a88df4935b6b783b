"""What the project's kernels cost the hardware they run on, read from their sm_90a builds on the CPU:
registers, spills, shared memory and the static SASS instruction mix of each kernel the anchors
compare (``anchors.py``): the absorbed attention's Gluon kernel against FlashMLA, the dense scorer
(FP8 and bf16) against DeepGEMM.

Triton compiles each kernel for sm_90 with no GPU (``GPUTarget("cuda", 90, 32)``); the ptxas and
cuobjdump Triton's wheel ships assemble it for sm_90a and list its SASS. Every opcode of the whole
kernel is counted once (a static count, not a trace), grouped as ``OPCODE_GROUPS`` says, and the
local loads and stores are placed in the partitions that issue them (``spills_by_partition``): a
change to a kernel shows here as moved registers, spills or instructions before any GPU time is spent.

    python3 benchmarks/kernel_resources.py --out benchmarks/results/kernel_resources_cpu.json

Run with ``TRITON_INTERPRET`` unset (the script refuses otherwise: the interpreter builds nothing).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402

OPCODE_GROUPS = {
    "mma": ("HGMMA", "QGMMA", "HMMA", "IMMA"),
    "fp32": ("FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP", "FCHK", "MUFU", "FRND", "F2F", "F2I", "I2F", "F2FP"),
    "load": ("LDG", "LDGSTS", "LDS", "LDSM", "LDL", "LDC", "ULDC", "LD"),
    "store": ("STG", "STS", "STSM", "STL", "ST", "RED", "ATOM", "ATOMS", "ATOMG"),
    "sync": ("BAR", "SYNCS", "DEPBAR", "WARPSYNC", "WARPGROUP", "BSYNC", "BSSY", "ARRIVES", "MEMBAR", "FENCE",
             "ERRBAR", "CCTL"),
    "shuffle": ("SHFL",),
}
"""SASS opcodes (the mnemonic before its first '.') counted per group; every other opcode (integer,
predicate, branch, move) counts as "other"."""
KERNELS = ("absorbed_ws_bf16", "dense_scorer_fp8", "dense_scorer_bf16")
"""The kernels built, by name (``_build``)."""


def _tools() -> dict[str, Path]:
    import triton

    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    return {"ptxas": bin_dir / "ptxas", "cuobjdump": bin_dir / "cuobjdump"}


def _aligned(kernel, consts: dict, stride=lambda name: name.startswith("stride")) -> dict:
    """tt.divisibility 16 on every pointer and every ``stride`` argument that is not a constexpr (the
    inputs are 16-byte aligned tensors with strides in whole 16-element steps)."""
    return {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
            if n not in consts and (n.endswith("_ptr") or stride(n))}


def build_absorbed_ws(dtype: str = "bf16", mean_rows: bool = False, index: str = "i64", split: bool = False):
    """Triton's compiled Gluon attention kernel for sm_90 at DeepSeek-V3.2's latent shape: q, latent,
    rope and output of ``dtype`` ("bf16" or "fp16"), index lists of ``index`` ("i32" or "i64"), its
    split form under ``split``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from compiler.lowering.attention import absorbed_attention_ws as W

    kernel = W._absorbed_attention_ws_kernel
    consts = dict(LAT_DIM=W.LAT_DIM, ROPE_DIM=W.ROPE_DIM, MEAN_ROWS=mean_rows, SPLIT=split, WIDE_OFFSETS=False,
                  BLOCK_H=W.BLOCK_H, BLOCK_N=W.BLOCK_N, CONSUMER_REGISTERS=W.CONSUMER_REGISTERS, num_warps=W.PRODUCER_WARPS)
    tensors = ("qlat_ptr", "qrope_ptr", "lat_ptr", "rope_ptr", "o_ptr")
    signature = {n: "constexpr" if n in consts else f"*{dtype}" if n in tensors else f"*{index}" if n == "idx_ptr"
                 else "*fp32" if n.endswith("_ptr") else "fp32" if n == "qk_scale_log2" else "i32"
                 for n in kernel.arg_names}
    source = GluonASTSource(kernel, signature, constexprs=consts, attrs=_aligned(kernel, consts))
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": W.PRODUCER_WARPS})


def _build(name: str):
    """Triton's compiled kernel ``name`` at DeepSeek-V3.2's shapes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if name == "absorbed_ws_bf16":
        return build_absorbed_ws()
    from compiler.lowering.scoring import indexer_scores as I

    fp8 = name == "dense_scorer_fp8"
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    config = I.scorer_config(dtype)
    kernel = I._dense_score_kernel
    # the anchors' case: a causal mask (its bounds), int32 code words, chunk maxima
    consts = dict(BLOCK_S=I.score_tile_shape(64, dtype)[0], HP=64, D=128, BLOCK_T=dict(config.meta)["BLOCK_T"],
                  MASK_KIND=1, TO_FP32=False, ROWS=False, SEQUENTIAL=False, TF32=False, FP8=fp8, MAXIMA=True, WORDS=True,
                  sqh=128, skt=128, mst=1)
    element = "*fp8e4nv" if fp8 else "*bf16"
    types = dict(q_ptr=element, k_ptr=element, w_ptr="*fp32", ks_ptr="*fp32", mask_ptr="*u8", bounds_ptr="*i32",
                 out_ptr="*i32", max_ptr="*i64", rows_ptr="*i64")
    signature = {n: "constexpr" if n in consts else types.get(n, "i32") for n in kernel.arg_names}
    aligned = _aligned(kernel, consts, stride=lambda n: n.startswith("s") and n != "S")  # the scorer's s* strides
    launch = I.scorer_launch(dtype)
    options = {k: launch[k] for k in ("num_warps", "num_stages", "enable_fp_fusion") if k in launch}
    return triton.compile(ASTSource(kernel, signature, constexprs=consts, attrs=aligned),
                          target=GPUTarget("cuda", 90, 32), options=options)


def opcode_groups(sass: str) -> dict[str, int]:
    """{group: count} of the instructions in a cuobjdump SASS listing (``OPCODE_GROUPS``), with
    "other" and "total"."""
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass)
    groups: Counter = Counter()
    for op in ops:
        group = next((g for g, names in OPCODE_GROUPS.items() if op in names), "other")
        groups[group] += 1
    return {**{g: groups.get(g, 0) for g in (*OPCODE_GROUPS, "other")}, "total": len(ops)}


def spills_by_partition(sass: str) -> list[list[int]]:
    """[registers, local loads and stores] of each stretch of the listing that a ``setmaxnreg`` opens
    and that touches local memory, in listing order: which partition of a warp-specialised kernel
    spills (the consumers' stretches open at their raised count, the producer's at its lowered one).
    Code before the first ``setmaxnreg`` counts under registers 0."""
    out: list[list[int]] = []
    registers, count = 0, 0
    for line in sass.splitlines():
        found = re.search(r"USETMAXREG\.\w+(?:\.\w+)*\s+(?:UP\d+,\s*)?(0x[0-9a-f]+)", line)
        if found:
            if count:
                out.append([registers, count])
            registers, count = int(found.group(1), 16), 0
        elif re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?(?:STL|LDL)\b", line):
            count += 1
    if count:
        out.append([registers, count])
    return out


def ptxas_report(report: str) -> dict[str, int]:
    """Registers, spill store and load bytes and stack bytes from ``ptxas -v``'s output."""
    def first(pattern: str) -> int:
        found = re.search(pattern, report)
        return int(found.group(1)) if found else 0
    return {"registers": first(r"Used (\d+) registers"), "spill_store_bytes": first(r"(\d+) bytes spill stores"),
            "spill_load_bytes": first(r"(\d+) bytes spill loads"), "stack_bytes": first(r"(\d+) bytes stack frame")}


def kernel_row(name: str, work: Path) -> dict:
    """One kernel's resources (module docstring)."""
    return resources(_build(name), name, work)


def resources(built, name: str, work: Path) -> dict:
    """The resources of Triton's compiled kernel ``built`` (module docstring), assembled in ``work``."""
    tools = _tools()
    ptx, cubin = work / f"{name}.ptx", work / f"{name}.cubin"
    ptx.write_text(built.asm["ptx"])
    report = subprocess.run([str(tools["ptxas"]), "-arch=sm_90a", "-v", str(ptx), "-o", str(cubin)],
                            capture_output=True, text=True, check=True).stderr
    sass = subprocess.run([str(tools["cuobjdump"]), "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    text = built.asm["ptx"]
    return {"kernel": name, "warps": built.metadata.num_warps, "shared_bytes": built.metadata.shared, **ptxas_report(report),
            "mma_shapes": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+\.[\w.]+)", text))),
            "setmaxnreg": sorted(set(int(x) for x in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", text))),
            "sass": opcode_groups(sass), "spills_by_partition": spills_by_partition(sass)}


def render(doc: dict) -> str:
    columns = ["kernel", "warps", "registers", "spills (store / load B)", "spilling code (registers: local ops)",
               "shared B", "wgmma shapes", "setmaxnreg",
               *(f"SASS {g}" for g in (*OPCODE_GROUPS, "other", "total"))]
    body = [[r["kernel"], r["warps"], r["registers"], f"{r['spill_store_bytes']} / {r['spill_load_bytes']}",
             ", ".join(f"{regs}: {n}" for regs, n in r["spills_by_partition"]) or "-", r["shared_bytes"],
             ", ".join(r["mma_shapes"]) or "-", ", ".join(map(str, r["setmaxnreg"])) or "-",
             *(r["sass"][g] for g in (*OPCODE_GROUPS, "other", "total"))] for r in doc["rows"]]
    return "\n".join([f"# Kernel resources, sm_90a builds on the CPU ({doc['versions']})", "",
                      "Static counts over each whole kernel (module docstring of benchmarks/kernel_resources.py).", "",
                      harness.markdown_table(columns, body), ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON results path (a .md table is written beside it)")
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        p.error("TRITON_INTERPRET is set: the interpreter builds no GPU code; unset it")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [kernel_row(name, Path(tmp)) for name in args.kernels]
    doc = {"versions": harness.versions(), "target": "sm_90a", "rows": rows}
    harness.write_results(args.out, doc, render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
