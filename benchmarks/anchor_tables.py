"""``anchors.py``'s readable tables: one per part, each cell a variant's median ms (or why it has
none), then the issue's ratios and the largest error of the row's checked variants; for the decode
part also its calls' device time replayed from CUDA graphs and the host time to issue them."""
from __future__ import annotations

from benchmarks import harness
from benchmarks.anchor_attention import VARIANTS as ATTENTION_VARIANTS
from benchmarks.anchor_indexer import VARIANTS as INDEXER_VARIANTS


def _cell(result: dict | None) -> str:
    if not result:
        return "-"
    if "ms" in result:
        return f"{result['ms']:.3f}" if result["ms"] < 10 else f"{result['ms']:.1f}"
    return "skipped" if "skipped" in result else "error"


def _ratio(row: dict, key: str) -> str:
    return f"{row[key]:.2f}" if key in row else "-"


def _worst(row: dict, field: str, key: str) -> str:
    values = [r[field][key] for r in row.get("results", {}).values() if field in r]
    return f"{max(values):.2g}" if values else "-"


def attention_table(rows: list[dict], part: str) -> str:
    columns = ["B", "S", "T", "kind", *ATTENTION_VARIANTS, "FlashMLA / ws", "op / dispatch", "op / FlashMLA",
               "op / pipeline", "max abs err"]
    body = [[r["B"], r["S"], r["T"], r["kind"],
             *([_cell(r["results"].get(v)) for v in ATTENTION_VARIANTS] if "results" in r
               else [r.get("skipped", "-")] + ["-"] * (len(ATTENTION_VARIANTS) - 1)),
             _ratio(r, "ws_speed_vs_flashmla"), _ratio(r, "op_over_dispatch"), _ratio(r, "op_over_flashmla"),
             _ratio(r, "op_over_pipeline"), _worst(r, "err_vs_fp32", "max_abs")]
            for r in rows if r["part"] == part]
    return harness.markdown_table(columns, body)


def _ms(result: dict | None, field: str) -> str:
    value = (result or {}).get(field)
    return "-" if value is None else f"{value:.3f}"


def decode_split_table(rows: list[dict]) -> str:
    """Decode rows: device ms of FlashMLA, the Gluon kernel and the op replayed from CUDA graphs, the
    op's and the kernel's over FlashMLA's, and the host ms to issue FlashMLA and the op."""
    columns = ["B", "S", "T", "kind", "FlashMLA graph", "ws graph", "op graph", "op graph / FlashMLA graph",
               "ws graph / FlashMLA graph", "FlashMLA issue", "ws issue", "op issue"]
    body = []
    for r in rows:
        if r["part"] != "decode" or "results" not in r:
            continue
        res = r["results"]
        body.append([r["B"], r["S"], r["T"], r["kind"], _ms(res.get("flashmla"), "graph_ms"),
                     _ms(res.get("project_ws"), "graph_ms"), _ms(res.get("project_op"), "graph_ms"),
                     _ratio(r, "op_graph_over_flashmla_graph"), _ratio(r, "ws_graph_over_flashmla_graph"),
                     _ms(res.get("flashmla"), "issue_ms"), _ms(res.get("project_ws"), "issue_ms"),
                     _ms(res.get("project_op"), "issue_ms")])
    return harness.markdown_table(columns, body)


def indexer_table(rows: list[dict]) -> str:
    columns = ["S", "T", "H", *INDEXER_VARIANTS, "dg+topk / dense fp8", "dg logits / scorer", "bf16 / fp8 op",
               "scorer TFLOP/s", "dg TFLOP/s", "max rel err", "min top-K overlap"]
    body = []
    for r in rows:
        if r["part"] != "indexer":
            continue
        res = r.get("results", {})
        rate = (lambda name: f"{res[name]['tflops_visible']:.0f}" if "tflops_visible" in res.get(name, {}) else "-")
        overlaps = [x["topk_overlap_min"] for x in res.values() if "topk_overlap_min" in x]
        body.append([r["S"], r["T"], r.get("H", "-"),
                     *([_cell(res.get(v)) for v in INDEXER_VARIANTS] if res
                       else [r.get("skipped", "-")] + ["-"] * (len(INDEXER_VARIANTS) - 1)),
                     _ratio(r, "dg_topk_over_dense_fp8"), _ratio(r, "dg_logits_over_scorer"),
                     _ratio(r, "bf16_over_fp8_op"), rate("project_scorer"), rate("dg_logits"),
                     _worst(r, "err_vs_fp64", "max_rel"), f"{min(overlaps):.3f}" if overlaps else "-"])
    return harness.markdown_table(columns, body)


def host_profile_section(rows: list[dict]) -> list[str]:
    """Lines of a table of the whole op's host time by function (``op_host_profile``) on the first
    and the last decode row that has one; none where no row has one."""
    profiled = [r for r in rows if r["part"] == "decode" and "op_host_profile" in r]
    lines = []
    for r in profiled[:1] + profiled[1:][-1:]:
        prof = r["op_host_profile"]
        lines += [f"### The op's host time by function, B={r['B']} S={r['S']} T={r['T']} {r['kind']}: "
                  f"{prof['us_per_call']} µs a call under cProfile", "",
                  harness.markdown_table(["function", "own µs", "cumulative µs", "runs a call"],
                                         [[f["function"], f["own_us"], f["cum_us"], f["per_call"]]
                                          for f in prof["functions"]]), ""]
    return lines


def tables(doc: dict) -> str:
    """The document's markdown: its device and anchors, its ``notes`` (where runs were combined), a
    table per part present, then every variant that was skipped or failed, with the reason."""
    rows = doc["rows"]
    parts = [p for p in ("prefill", "decode", "indexer") if any(r["part"] == p for r in rows)]
    lines = [f"{doc['device']}; torch {doc['versions'].get('torch')}, triton {doc['versions'].get('triton')}; "
             f"FlashMLA {doc.get('flashmla_commit')}, DeepGEMM {doc.get('deepgemm_commit')}",
             f"FlashMLA entry: {doc['flashmla_entry']}", *harness.notes_lines(doc), ""]
    titles = {"prefill": "Sparse MLA prefill (ms; ratios of ms)", "decode": "Decode-sized calls (ms; ratios of ms)",
              "indexer": "FP8 indexer, causal (ms; ratios of ms)"}
    for part in parts:
        lines += [f"### {titles[part]}", "",
                  indexer_table(rows) if part == "indexer" else attention_table(rows, part), ""]
        if part == "decode":
            lines += ["### Decode-sized calls: device ms replayed from CUDA graphs, host ms to issue a call", "",
                      decode_split_table(rows), ""]
            lines += host_profile_section(rows)
    notes = [f"{r['part']} S={r['S']} T={r['T']}{' B=' + str(r['B']) if 'B' in r else ''} {name}: "
             f"{res.get('skipped') or res.get('error')}"
             for r in rows for name, res in r.get("results", {}).items() if "ms" not in res]
    notes += [f"{r['part']} S={r['S']} T={r['T']} B={r['B']} {name}: no CUDA graph: {res['graph_error']}"
              for r in rows for name, res in r.get("results", {}).items() if "graph_error" in res]
    notes += [f"{r['part']} S={r['S']} T={r['T']}: {r['skipped']}" for r in rows if "skipped" in r]
    if notes:
        lines += ["Skipped or failed:", *sorted(set(f"- {n}" for n in notes))]
    return "\n".join(lines)
