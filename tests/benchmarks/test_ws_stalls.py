"""benchmarks/ws_stalls.py: the partitions, causes and barrier names it reads from an ncu listing."""
import csv
import json
import re
from pathlib import Path

import pytest

from benchmarks import ws_stalls

HEADER = ["Address", "Source", ws_stalls.SAMPLES, "stall_long_sb", "stall_barrier", "stall_wait"]
BASE = 0x38530


def _listing(rows: list[tuple[str, int, int, int, int]]) -> list[list[str]]:
    """Rows of (source, samples, long_sb, barrier, wait) at consecutive addresses, after ncu's preamble."""
    body = [[hex(0x7f00 + 16 * i), source, *map(str, counts)] for i, (source, *counts) in enumerate(rows)]
    return [["Kernel Name", "_absorbed_attention_ws_kernel"], HEADER, *body]


def _wait(offset: int, pred: str = "P0") -> str:
    return f"SYNCS.PHASECHK.TRANS64.TRYWAIT {pred}, [UR9+{hex(BASE + offset)}], R3"


ROWS = [
    ("ULDC.64 UR4, c[0x0][0x230]", 1, 0, 0, 1),
    ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0x100", 0, 0, 0, 0),  # not a consumer's count: "other"
    ("USETMAXREG.DEALLOC.CTAPOOL 0x78", 0, 0, 0, 0),
    ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8", 0, 0, 0, 0),  # even
    (_wait(0x10), 2, 0, 0, 2),                                  # hi_ready0
    ("@!P0 BRA 0x7f6196c1dc60", 30, 30, 0, 0),
    ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 20, 0, 20, 0),
    ("FMUL R1, R2, R3", 8, 0, 0, 8),
    ("USETMAXREG.DEALLOC.CTAPOOL 0x78", 0, 0, 0, 0),
    ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8", 0, 0, 0, 0),  # odd
    (_wait(0x40, "P1"), 0, 0, 0, 0),                           # p_ready0, its branch two lines on
    ("PRMT R191, R19, 0x7773, RZ", 10, 0, 0, 10),
    ("@!P1 BRA 0x7f6196c1dd50", 40, 40, 0, 0),
    ("BAR.SYNC.DEFER_BLOCKING 0x3, 0x80", 10, 0, 10, 0),
    ("USETMAXREG.DEALLOC.CTAPOOL 0x78", 0, 0, 0, 0),
    ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0x100", 0, 0, 0, 0),  # the epilogue's spare warps: "other"
    ("NOP", 50, 0, 50, 0),
    ("USETMAXREG.DEALLOC.CTAPOOL 0x28", 0, 0, 0, 0),         # producer
    ("ISETP.GE.AND P1, PT, R5, UR13, PT", 30, 30, 0, 0),
    (_wait(0x20, "P5"), 0, 0, 0, 0),                           # lo_free0
    ("@!P5 BRA 0x7f6196c1ddc0", 10, 10, 0, 0),
    ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0x100", 0, 0, 0, 0),
    # the out-of-line retry loops name every barrier once
    *((_wait(8 * k), 0, 0, 0, 0) for k in range(len(ws_stalls.BARRIERS))),
]


@pytest.fixture
def listing(tmp_path) -> Path:
    path = tmp_path / "k_sass.csv"
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(_listing(ROWS))
    return path


def test_partitions_causes_and_barrier_names(listing):
    summary = ws_stalls.stall_summary(*ws_stalls.read_listing(listing), consumer_registers=0xe8)
    assert summary["samples"] == 211
    parts = summary["partitions"]
    assert parts["even"]["share"] == round(60 / 211, 4)
    assert parts["even"]["causes"] == {"waits hi_ready0": 0.5, "wgmma": round(20 / 60, 4), "other": round(10 / 60, 4)}
    # the try-wait's branch is found past the instructions between them, by its predicate
    assert parts["odd"]["causes"] == {"waits p_ready0": round(40 / 60, 4), "other": round(10 / 60, 4),
                                      "bar.sync": round(10 / 60, 4)}
    assert parts["producer"]["causes"] == {"global loads": 0.75, "waits lo_free0": 0.25}
    assert parts["producer"]["share"] == round(40 / 211, 4)


def test_barriers_named_by_offset_when_they_do_not_match(listing):
    sources = [row[1] for row in ws_stalls.read_listing(listing)[1]][:-3]  # three barriers fewer
    names = ws_stalls.barrier_names(sources)
    assert names[BASE + 0x10] == hex(BASE + 0x10)


def test_barriers_follow_the_kernels_allocation_order():
    from compiler.lowering.attention import absorbed_attention_ws

    source = Path(absorbed_attention_ws.__file__).read_text()
    allocated = re.findall(r"(\w+) = gl\.allocate_shared_memory\(gl\.int64, \[2, 1\]", source)
    assert tuple(f"{name}{i}" for name in allocated for i in (0, 1)) == ws_stalls.BARRIERS


def test_bad_listings_are_refused(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("Kernel Name,x\n")
    with pytest.raises(ValueError, match="Address"):
        ws_stalls.read_listing(empty)
    silent = tmp_path / "silent.csv"
    with silent.open("w", newline="") as f:
        csv.writer(f).writerows(_listing([(s, 0, 0, 0, 0) for s, *_ in ROWS]))
    with pytest.raises(ValueError, match="no warp-state samples"):
        ws_stalls.stall_summary(*ws_stalls.read_listing(silent), consumer_registers=0xe8)


def test_report_writes_the_json_and_table(listing, tmp_path):
    details = tmp_path / "k_details.csv"
    with details.open("w", newline="") as f:
        csv.writer(f).writerows([["ID", "Section Name", "Metric Name", "Metric Unit", "Metric Value"],
                                 ["0", "GPU Speed Of Light Throughput", "Duration", "ms", "9.92"],
                                 ["0", "GPU Speed Of Light Throughput", "DRAM Frequency", "Ghz", "2.62"]])
    out = tmp_path / "stalls.json"
    assert ws_stalls.main(["report", "--runs", f"k={listing},{details}", "--consumer-registers", "232",
                           "--notes", "one note", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["runs"]["k"]["details"] == {"Duration": "9.92 ms"}
    table = out.with_suffix(".md").read_text()
    assert "- one note" in table and "waits hi_ready0" in table
    with pytest.raises(SystemExit):
        ws_stalls.main(["report", "--runs", f"k={listing}", "--out", str(out)])


def test_profile_refuses_a_length_past_one_launch():
    from compiler.lowering.attention import absorbed_attention as dispatch

    with pytest.raises(SystemExit):
        ws_stalls.main(["profile", "--S", str(dispatch.MAX_CHUNK + 1)])
