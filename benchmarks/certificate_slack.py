"""Where the certificate's slack comes from on a trained indexer (CPU or GPU, float64 bounds).

For each layer of the trained DSA measuring model (``runtime.indexer_zoo``'s ``trained`` family:
the last S queries of a held-out window of T tokens), K in ``--topk``:

* ``positive_heads``: mean share of heads with w > 0;
* ``seed_gap``: (tau_K - tau_seed) / (tau_K - median score), tau_seed the K-th score over the
  op's seed set (sink 64, window 512, the anchor query's top-K), tau_K the true K-th score;
* per r: the share of keys the certificate (``runtime.certificate``, p from the seeds as the op
  computes it) prunes at tau_seed and at the oracle tau_K, and, over the keys below tau_K, the
  medians of: the gap tau_K - s to clear, the bound's excess U - s, the negative heads' mass
  sum_{w<0} |w| relu(q.k) (the part of the score the bound credits only through relu(a_A . k)),
  and the positive residual E ||k||;
* ``groups``: the pruning an exact variant would reach at the oracle threshold if the negative
  heads were credited by m group terms, sum_G relu(sum_{h in G} |w_h| q_h . k) <= sum_{h in N}
  |w_h| relu(q_h . k) (heads grouped by k-means on their unit q directions), with every positive
  head retained exactly: the best any screen of |H+| + m dots per key can do with such groups;
* ``oracle_tiles``: per query tile of n in ``QUERY_TILES`` consecutive queries, the share of
  (query tile, tile of KEY_TILE keys) pairs with a visible key whose largest exact score stays below
  every one of the tile's tau_K: the most that any bound shared by the tile (which cannot be below
  the exact scores it bounds) lets a tiled scorer skip, even at the oracle threshold.

    python benchmarks/certificate_slack.py --S 256 --out benchmarks/results/certificate_slack_trained_cpu.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from runtime.certificate import evaluate_bound, plan_certificate
from runtime.indexer_zoo import zoo_inputs
from runtime.rounding import key_norm_up
from runtime.seeds import seed_mask

H, D = 64, 128
QUERY_TILES = (1, 16, 64)
KEY_TILE = 64


def oracle_tiles(s: torch.Tensor, visible: torch.Tensor, tau: torch.Tensor, n: int) -> float:
    """Share of (n-query tile, KEY_TILE-key tile) pairs with a visible key where every score is
    below each of the tile's queries' tau (``s`` [S, T] with -inf where hidden)."""
    S, T = s.shape
    rows, cols = S // n * n, T // KEY_TILE * KEY_TILE
    excess = (s[:rows, :cols] - tau[:rows, None]).view(rows // n, n, cols // KEY_TILE, KEY_TILE)
    seen = visible[:rows, :cols].view(rows // n, n, cols // KEY_TILE, KEY_TILE).any(3).any(1)
    below = excess.amax(dim=(1, 3)) < 0
    return float((below & seen).sum() / seen.sum())


def exact(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scores, positive part, negative mass) [S, T] in float64."""
    dots = torch.relu(torch.einsum("shd,td->sht", q, k))
    pos = (torch.where(w > 0, w, 0.0)[..., None] * dots).sum(1)
    neg = (torch.where(w < 0, -w, 0.0)[..., None] * dots).sum(1)
    return pos - neg, pos, neg


def kmeans_groups(x: torch.Tensor, m: int, iters: int = 20) -> torch.Tensor:
    """Group labels [N] of unit rows x [N, D] into at most m clusters (cosine k-means, fixed start)."""
    m = min(m, x.shape[0])
    centres = x[torch.linspace(0, x.shape[0] - 1, m).long()].clone()
    for _ in range(iters):
        labels = (x @ centres.T).argmax(-1)
        for g in range(m):
            member = labels == g
            if member.any():
                c = x[member].sum(0)
                centres[g] = c / c.norm().clamp_min(1e-30)
    return (x @ centres.T).argmax(-1)


def grouped_prune(q, w, k, tau, below, m: int) -> float:
    """Share of keys below tau that the grouped-negative bound with all positives exact prunes."""
    pruned, total = 0, 0
    for i in range(q.shape[0]):
        neg = w[i] < 0
        qi = q[i]
        pos_part = (torch.where(w[i] > 0, w[i], 0.0)[:, None] * torch.relu(qi @ k.T)).sum(0)
        credit = torch.zeros_like(pos_part)
        if neg.any():
            nq = qi[neg] * (-w[i][neg])[:, None]
            labels = kmeans_groups(nq / nq.norm(dim=-1, keepdim=True).clamp_min(1e-30), m)
            for g in labels.unique():
                credit += torch.relu(nq[labels == g].sum(0) @ k.T)
        bound = pos_part - credit
        pruned += int(((bound < tau[i]) & below[i]).sum())
        total += int(below[i].sum())
    return pruned / max(1, total)


def layer_report(layer: int, S: int, T: int, topk: int, rs: list[int], groups: list[int], seed: int,
                 model: str | None = None) -> dict:
    q, k, w, _ = zoo_inputs("trained", 1, S, T, H, D, seed=seed, layer=layer, model=model)
    q, k, w = q[0].double(), k[0].double(), w[0].double()
    pos_rows = torch.arange(T - S, T)
    visible = torch.arange(T)[None, :] <= pos_rows[:, None]
    s, _, neg = exact(q, w, k)
    s = s.masked_fill(~visible, float("-inf"))
    order = s.topk(topk, dim=-1)
    tau_k = order.values[:, -1]
    anchors = (torch.arange(S) // 16) * 16
    seeds = seed_mask(visible, order.indices[anchors], topk, 64, 512)
    seed_scores = s.masked_fill(~seeds, float("-inf"))
    tau_seed = seed_scores.topk(topk, dim=-1).values[:, -1]
    median = s.masked_fill(~visible, float("nan")).nanmedian(dim=-1).values
    below = visible & (s < tau_k[:, None])
    p = ((torch.einsum("shd,td->sht", q, k) > 0) & seeds[:, None, :]).sum(-1).double() / seeds.sum(-1, keepdim=True)
    key_norm = key_norm_up(k.float())
    rows = []
    for r in rs:
        plan = plan_certificate(q.float(), w.float(), p, torch.full((S,), r, dtype=torch.int64))
        U = evaluate_bound(plan, k.float()[None], key_norm[None])
        screened = visible & ~seeds
        residual = plan.residual[:, None] * key_norm[None]
        sel = below
        rows.append({
            "r": r,
            "pruned_at_tau_seed": float(((U < tau_seed[:, None]) & screened).sum() / screened.sum()),
            "pruned_at_tau_k": float(((U < tau_k[:, None]) & screened).sum() / screened.sum()),
            "median_gap": float((tau_k[:, None] - s)[sel].median()),
            "median_excess": float((U - s)[sel].median()),
            "median_negative_mass": float(neg[sel].median()),
            "median_positive_residual": float(residual.expand_as(s)[sel].median()),
            "abs_path_share": float(plan.abs_path.double().mean()),
        })
    grouped = [{"m": m, "pruned_at_tau_k": grouped_prune(q, w, k, tau_k, below, m)} for m in groups]
    return {"layer": layer, "T": T, "S": S, "topk": topk,
            "positive_heads": float((w > 0).double().mean()),
            "seed_gap": float(((tau_k - tau_seed) / (tau_k - median).clamp_min(1e-30)).median()),
            "tau_k_median": float(tau_k.median()), "score_median": float(median.median()),
            "certificate": rows, "groups": grouped,
            "oracle_tiles": {n: oracle_tiles(s, visible, tau_k, n) for n in QUERY_TILES}}


def render(result: dict, md: Path) -> None:
    """A markdown table and a plot (``md`` with .png) of a result."""
    lines = [f"# Certificate slack on the trained DSA measuring model (T={result['T']}, last {result['S']} queries)", "",
             "Pruned share of screened keys per r at the seed threshold / at the oracle tau_K; 'groups m': all positive "
             "heads exact, negative heads credited by m group terms, at tau_K. Medians over keys below tau_K "
             "(score units): gap tau_K - s, bound excess U - s, negative mass, positive residual E||k||.", "",
             f"'oracle tiles n': the share of (n queries x {KEY_TILE} keys) tiles whose exact scores all stay below "
             "the tile's tau_K, the most a bound shared by the tile could skip.", "",
             "| layer | K | positive heads | seed gap | r: pruned at seed / oracle | groups m: pruned | "
             "oracle tiles n: skippable | r=8: gap, excess, negative mass, residual |", "|---|---|---|---|---|---|---|---|"]
    for row in result["layers"]:
        cert = "; ".join(f"{c['r']}: {c['pruned_at_tau_seed']:.2f}/{c['pruned_at_tau_k']:.2f}" for c in row["certificate"])
        groups = "; ".join(f"{g['m']}: {g['pruned_at_tau_k']:.2f}" for g in row["groups"])
        r8 = next((c for c in row["certificate"] if c["r"] == 8), None)
        slack = "-" if r8 is None else (f"{r8['median_gap']:.3g}, {r8['median_excess']:.3g}, "
                                        f"{r8['median_negative_mass']:.3g}, {r8['median_positive_residual']:.3g}")
        tiles = "; ".join(f"{n}: {v:.2f}" for n, v in row.get("oracle_tiles", {}).items()) or "-"
        lines.append(f"| {row['layer']} | {row['topk']} | {row['positive_heads']:.2f} | {row['seed_gap']:.2f} | "
                     f"{cert} | {groups} | {tiles} | {slack} |")
    md.write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    for ax, topk in zip(axes, sorted({r["topk"] for r in result["layers"]}, reverse=True)):
        for row in (r for r in result["layers"] if r["topk"] == topk):
            rs = [c["r"] for c in row["certificate"]]
            line, = ax.plot(rs, [c["pruned_at_tau_k"] for c in row["certificate"]], "o-", label=f"layer {row['layer']}")
            ax.plot(rs, [c["pruned_at_tau_seed"] for c in row["certificate"]], "x:", color=line.get_color())
        ax.set(xscale="log", xlabel="retained heads r", title=f"K={topk}: pruned at tau_K (o) and at tau_seed (x)",
               ylim=(-0.02, 1.02))
        ax.legend(fontsize=7)
    axes[0].set_ylabel("share of screened keys pruned")
    fig.tight_layout()
    fig.savefig(md.with_suffix(".png"), dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--T", type=int, default=8192)
    parser.add_argument("--S", type=int, default=128)
    parser.add_argument("--topk", type=int, nargs="+", default=[2048, 512])
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--r", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", help="DSA checkpoint directory (default: the trained measuring model)")
    parser.add_argument("--render", type=Path, help="only write the markdown (and .png) of an existing --out JSON here")
    args = parser.parse_args(argv)
    if args.render is not None:
        render(json.loads(args.out.read_text()), args.render)
        return
    if not args.out.parent.is_dir():
        parser.error(f"--out: directory {args.out.parent} does not exist")
    if args.S > args.T or args.S < 1:
        parser.error(f"--S: expected 1 <= S <= T={args.T}, got {args.S}")
    t0 = time.time()
    result = {"T": args.T, "S": args.S, "seed": args.seed, "layers": []}
    for layer in args.layers:
        for topk in args.topk:
            result["layers"].append(layer_report(layer, args.S, args.T, topk, args.r, args.groups, args.seed,
                                                  args.model))
            row = result["layers"][-1]
            print(json.dumps({"layer": layer, "topk": topk, "positive_heads": round(row["positive_heads"], 3),
                              "seed_gap": round(row["seed_gap"], 3),
                              "pruned_tau_k": {c["r"]: round(c["pruned_at_tau_k"], 3) for c in row["certificate"]},
                              "groups": {g["m"]: round(g["pruned_at_tau_k"], 3) for g in row["groups"]},
                              "oracle_tiles": {n: round(v, 3) for n, v in row["oracle_tiles"].items()}}), flush=True)
            args.out.write_text(json.dumps(result, indent=1))
    result["seconds"] = round(time.time() - t0, 1)
    args.out.write_text(json.dumps(result, indent=1))
    render(result, args.out.with_suffix(".md"))


if __name__ == "__main__":
    main()
