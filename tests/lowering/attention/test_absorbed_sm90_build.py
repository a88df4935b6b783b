"""Every launch configuration of the absorbed attention kernel builds for Hopper (sm_90) at
DeepSeek-V3.2's latent shape: Triton's compiler and the ptxas its wheel ships run on the CPU, so a
configuration that ptxas rejects or whose shared memory exceeds a Hopper block's never ships."""
import json
import os
import subprocess
import sys
from pathlib import Path

HOPPER_SHARED_BYTES = 232448
"""Most shared memory one block may opt into on sm_90 (227 KiB)."""

_SIGNATURE = r"""
def sm90_args(kernel, consts, tensor_type, index_type):
    # (signature, attrs) of a build: q/latent/rope/o tensors of tensor_type, indices of index_type,
    # other pointers fp32, the scale fp32, other integers i32; pointers and strides 16-aligned.
    tensors = ("qlat_ptr", "qrope_ptr", "lat_ptr", "rope_ptr", "o_ptr")
    signature = {n: "constexpr" if n in consts else f"*{tensor_type}" if n in tensors
                 else f"*{index_type}" if n == "idx_ptr" else "*fp32" if n.endswith("_ptr")
                 else "fp32" if n == "qk_scale_log2" else "i32" for n in kernel.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
               if n not in consts and (n.endswith("_ptr") or n.startswith("stride"))}
    return signature, aligned
"""

_BUILD = _SIGNATURE + r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from compiler.lowering.attention import absorbed_attention as A

kernel = A._absorbed_attention_kernel
unit = ("stride_qc", "stride_rd", "stride_lc", "stride_kd", "stride_ik", "stride_oc")
for name, config in A.CONFIGS.items():
    meta = dict(config.meta)
    consts = dict({u: 1 for u in unit}, lat_dim=512, rope_dim=64, MEAN_ROWS=False, SPLIT=False, UPCAST=False,
                  DOT_PRECISION="tf32", BLOCK_H=meta["BLOCK_H"], BLOCK_N=meta["BLOCK_N"], BLOCK_C=512, BLOCK_R=64)
    signature, aligned = sm90_args(kernel, consts, "bf16", "i32")
    built = triton.compile(ASTSource(kernel, signature, constexprs=consts, attrs=aligned),
                           target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": config.num_warps, "num_stages": config.num_stages})
    print(json.dumps({"config": name, "shared": built.metadata.shared, "cubin": len(built.asm["cubin"])}), flush=True)
"""


def build_rows(script: str, tmp_path: Path) -> list[dict]:
    """The JSON rows a build script prints, run compiled (not interpreted) in ``tmp_path`` with the
    project importable and a Triton cache of its own."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_every_absorbed_config_builds_for_sm90_within_a_blocks_shared_memory(tmp_path):
    from compiler.lowering.attention.absorbed_attention import CONFIGS

    built = {row["config"]: row for row in build_rows(_BUILD, tmp_path)}
    assert set(built) == set(CONFIGS)
    for name, row in built.items():
        assert row["cubin"] > 0 and row["shared"] <= HOPPER_SHARED_BYTES, (name, row)


_BUILD_WS = r"""
import json
from pathlib import Path
from benchmarks import kernel_resources as K

for dtype, mean_rows, index, split in (("bf16", True, "i32", False), ("fp16", False, "i64", False),
                                      ("bf16", False, "i64", True)):
    built = K.build_absorbed_ws(dtype, mean_rows, index, split)
    row = K.resources(built, "ws", Path("."))
    ptx = built.asm["ptx"]
    print(json.dumps({"dtype": dtype, "mean_rows": mean_rows, "index": index, "split": split,
                      "shared": row["shared_bytes"],
                      "wgmma": ptx.count("wgmma.mma_async"), "cp_async": ptx.count("cp.async.cg"),
                      "setmaxnreg": ptx.count("setmaxnreg"),
                      "spill_bytes": row["spill_store_bytes"] + row["spill_load_bytes"]}), flush=True)
"""


WS_SPILL_BYTES = 0
"""Spill bytes ptxas may report for the Gluon kernel: none (its consumers build their wgmma
descriptors in the loop, ``absorbed_attention_ws._opaque_one``; hoisted, they spilled 832 bytes)."""


def test_the_warp_specialised_kernel_builds_for_sm90_within_its_spill_bound(tmp_path):
    # bf16 with mean rows and int32 index lists (the masked, deduplicated path); fp16 with int64 top-K
    # indices; the split form (decode-sized grids, fp32 partials).
    rows = build_rows(_BUILD_WS, tmp_path)
    assert len(rows) == 3
    for row in rows:
        assert row["shared"] <= HOPPER_SHARED_BYTES, row
        assert row["wgmma"] > 0 and row["cp_async"] > 0 and row["setmaxnreg"] > 0, row
        assert row["spill_bytes"] <= WS_SPILL_BYTES, row
