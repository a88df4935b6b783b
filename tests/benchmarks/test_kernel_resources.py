"""benchmarks/kernel_resources.py: the parsers on known text, the refusal under the interpreter, and a
real sm_90a build of the FP8 scorer (Triton's compiler and the ptxas and cuobjdump its wheel ships run
on the CPU)."""
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import kernel_resources as K

ROOT = Path(__file__).resolve().parents[2]


def test_the_parsers_read_ptxas_and_sass_text():
    report = ("ptxas info    : Function properties for k\n    360 bytes stack frame, 384 bytes spill stores, "
              "352 bytes spill loads\nptxas info    : Used 168 registers, used 4 barriers\n")
    assert K.ptxas_report(report) == {"registers": 168, "spill_store_bytes": 384, "spill_load_bytes": 352,
                                      "stack_bytes": 360}
    sass = ("        /*0000*/                   LDC R1, c[0x0][0x28] ;\n"
            "        /*0010*/                   HGMMA.64x64x16.F32.BF16 gdesc[UR4], RZ ;\n"
            "        /*0020*/              @!P0 FFMA R2, R3, R4, R5 ;\n"
            "        /*0030*/                   SHFL.BFLY PT, R6, R7, 0x1, 0x1f ;\n"
            "        /*0040*/                   IADD3 R8, R9, 0x1, RZ ;\n")
    assert K.opcode_groups(sass) == {"mma": 1, "fp32": 1, "load": 1, "store": 0, "sync": 0, "shuffle": 1,
                                     "other": 1, "total": 5}
    assert K.spills_by_partition(sass) == []
    ws = ("        /*0000*/                   STL [R1], R0 ;\n"
          "        /*0010*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8 ;\n"
          "        /*0020*/                   STL [R1+0x4], R2 ;\n"
          "        /*0030*/              @!P1 LDL.64 R4, [R1+0x8] ;\n"
          "        /*0040*/                   USETMAXREG.DEALLOC.CTAPOOL 0x28 ;\n"
          "        /*0050*/                   LDS R6, [R7] ;\n"
          "        /*0060*/                   USETMAXREG.DEALLOC.CTAPOOL 0x28 ;\n"
          "        /*0070*/                   LDL R8, [R1] ;\n")
    assert K.spills_by_partition(ws) == [[0, 1], [232, 2], [40, 1]]
    assert K.ptxas_report("nothing") == {"registers": 0, "spill_store_bytes": 0, "spill_load_bytes": 0,
                                         "stack_bytes": 0}


def _run(args, interpret: bool, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_resources.py"), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)


def test_a_real_build_reports_the_fp8_scorer(tmp_path):
    out = tmp_path / "kr.json"
    done = _run(["--out", str(out), "--kernels", "dense_scorer_fp8"], False, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    row, = json.loads(out.read_text())["rows"]
    assert row["kernel"] == "dense_scorer_fp8" and row["registers"] > 0 and row["shared_bytes"] > 0
    assert any("e4m3" in shape for shape in row["mma_shapes"]) and row["sass"]["mma"] > 0
    assert row["sass"]["total"] == sum(v for k, v in row["sass"].items() if k != "total")
    assert row["spills_by_partition"] == []  # the scorer spills nowhere (one partition, no setmaxnreg)
    assert "dense_scorer_fp8" in out.with_suffix(".md").read_text()


def test_the_interpreter_is_refused(tmp_path):
    done = _run(["--out", str(tmp_path / "kr.json")], True, tmp_path)
    assert done.returncode != 0 and "TRITON_INTERPRET" in done.stderr
