"""Pulsar over several devices: correctness against the one-device driver, phase-1 and phase-2 latency.

    PYTHONPATH=. python3 benchmarks/pulsar_multigpu.py --ranks-in-turn 4 --out r.json --md r.md
    PYTHONPATH=. torchrun --nproc-per-node 4 benchmarks/pulsar_multigpu.py --out r.json --md r.md
    PYTHONPATH=. python3 benchmarks/pulsar_multigpu.py --tiny --device cpu --backend gloo --world-size 2

A Llama-shaped ``LlamaForCausalLM`` (random weights, compiled with the ``pulsar_dosa`` backend),
random ids, one block per rank. Per length: ``dense`` on one device, ``star`` and ``pulsar`` on one
device and over the ranks: ``phase1_ms`` (the slowest rank), ``phase2_ms``, ``decode_ms_per_token``,
``tokens_equal`` and ``kv_max_abs_diff`` against the one-device driver (bf16 tiles round
differently; ``--dtype float32`` separates rounding from logic). Over processes (torchrun or
``--world-size``; NCCL on CUDA, gloo on the CPU) phase 2 all-gathers each layer's partial (o, lse);
``--ranks-in-turn N`` runs the ranks one after another on one device (rows ``simulated``). Every
process turns NVLink multicast off (``MULTICAST_OFF``) before anything initialises."""
from __future__ import annotations

import os

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(MULTICAST_OFF)

import argparse  # noqa: E402
import datetime  # noqa: E402
import math  # noqa: E402
import socket  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from typing import Callable, Optional, Sequence  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from benchmarks import harness  # noqa: E402
from compiler.backend import pulsar_dosa  # noqa: E402
from runtime.attention_layout import QueryPhase, attention_kernel  # noqa: E402
from runtime.distributed import encode_rank_context, gather_and_merge, rank_blocks, restrict_layout  # noqa: E402
from runtime.lse_merge import merge_partials  # noqa: E402
from runtime.pulsar import KeptKV, PulsarConfig, decode, encode_context  # noqa: E402
from runtime.summaries import num_blocks  # noqa: E402

MODES = ("dense", "star", "pulsar")


@dataclass(frozen=True)
class ModelShape:
    """Decoder shape of the random-weight Llama."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    layers: int
    vocab: int


LLAMA_8B = dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, mlp=14336, vocab=32000)
TINY = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, mlp=128, vocab=256)


@dataclass(frozen=True)
class Settings:
    """Everything a run needs besides the devices; the same on every rank."""

    shape: ModelShape
    lengths: tuple[int, ...]
    sink: int
    chunk: int
    ratio: float
    query_tokens: int
    new_tokens: int
    reps: int
    dtype: str
    modes: tuple[str, ...] = MODES


def build_model(settings: Settings, device: torch.device) -> LlamaForCausalLM:
    """The random-weight Llama (seed 0) in ``settings.dtype`` on ``device``, in eval mode.

    Under an initialised process group every rank receives rank 0's weights.
    """
    s = settings.shape
    config = LlamaConfig(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.mlp,
                         num_hidden_layers=s.layers, num_attention_heads=s.heads,
                         num_key_value_heads=s.kv_heads, head_dim=s.head_dim,
                         max_position_embeddings=max(settings.lengths) + settings.query_tokens
                         + settings.new_tokens, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model = model.to(getattr(torch, settings.dtype)).eval()
    if dist.is_initialized():
        with torch.no_grad():
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor, src=0)
    return model


def compile_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model compiled with the pulsar_dosa backend (attention rewritten to the layout op)."""
    torch._dynamo.config.recompile_limit = 64
    return torch.compile(model, backend=pulsar_dosa, options={"downstream": "eager"})


def workload(length: int, query_tokens: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random context ids [length] and query ids [query_tokens] (CPU, seeded by length)."""
    gen = torch.Generator().manual_seed(length)
    return (torch.randint(0, vocab, (length,), generator=gen),
            torch.randint(0, vocab, (query_tokens,), generator=gen))


def pulsar_config(settings: Settings, mode: str, length: int, ranks: int) -> PulsarConfig:
    """One block per rank; summaries by the settings (pulsar only)."""
    return PulsarConfig(math.ceil(length / ranks), mode=mode, sink=settings.sink, chunk=settings.chunk,
                        ratio=settings.ratio)


def max_abs_diff(kept: KeptKV, truth: KeptKV) -> float:
    """Largest |difference| over every layer's kept keys and values (inf on a shape mismatch)."""
    worst = 0.0
    for (keys, values), (want_keys, want_values) in zip(kept, truth, strict=True):
        for got, want in ((keys, want_keys), (values, want_values)):
            if got.shape != want.shape:
                return float("inf")
            worst = max(worst, float((got.float() - want.float()).abs().max()))
    return worst


def max_abs(kept: KeptKV) -> float:
    """Largest |value| over every layer's kept keys and values (the scale of ``max_abs_diff``)."""
    return max(float(t.float().abs().max()) for pair in kept for t in pair)


@dataclass
class Reference:
    """The one-device driver's run of one (mode, length)."""

    row: dict
    kept: KeptKV
    tokens: torch.Tensor


def one_device_run(model, context_ids, query_ids, config: PulsarConfig, settings: Settings,
                   device: torch.device) -> Reference:
    """``runtime.pulsar.generate`` split into its timed phases (layout + encode, query, decode)."""
    def phase1():
        layout = config.layout(context_ids)
        return layout, encode_context(model, context_ids, layout)

    phase1_ms, (layout, kept) = timed(phase1, device, settings.reps)

    def run(new_tokens):
        return decode(model, kept, query_ids, query_position_start=layout.query_position_start,
                      max_new_tokens=new_tokens)

    phase2_ms, _ = timed(lambda: run(1), device, settings.reps)
    full_ms, tokens = timed(lambda: run(settings.new_tokens), device, settings.reps)
    row = {"mode": config.mode, "L": context_ids.numel(), "world_size": 1, "block_size": config.block_size,
           "tokens_per_device": layout.source_index.numel(), "phase1_ms": phase1_ms, "phase1_rank_ms": [phase1_ms],
           "phase2_ms": phase2_ms, "decode_ms_per_token": decode_ms(full_ms, phase2_ms, settings.new_tokens),
           "tokens_equal": None, "kv_max_abs_diff": None, "simulated": False, "tokens": tokens.tolist()}
    return Reference(row, kept, tokens)


def decode_ms(full_ms: float, phase2_ms: float, new_tokens: int) -> Optional[float]:
    """Mean time of a decode step: the full generation minus the query forward, per extra token."""
    return (full_ms - phase2_ms) / (new_tokens - 1) if new_tokens > 1 else None


class ShardedQueryPhase(QueryPhase):
    """Phase-2/decode attention of several ranks computed in one process.

    The cache holds the ranks' kept KV one after another (``shard_sizes`` tokens each, rank
    order), then the new tokens. Each rank's partial ``(o, lse)`` covers its own shard; the last
    rank (the owner) also sees the new tokens causally. The partials are merged with
    ``merge_partials``, exactly what ``runtime.distributed`` computes with an all-gather.
    """

    def __init__(self, shard_sizes: Sequence[int]):
        super().__init__(kept=sum(shard_sizes))
        self.shard_sizes = tuple(shard_sizes)

    def attend(self, q, k, v, *, scale, attention_fn=None):
        attention_fn = attention_kernel(q.device) if attention_fn is None else attention_fn
        batch, _, sq, _ = q.shape
        sk = k.shape[2]
        if sk < self.kept + sq:
            raise ValueError(f"sharded query attention expects at least kept + queries = {self.kept + sq} "
                             f"keys, got {sk}")
        outs, lses, start = [], [], 0
        for rank, size in enumerate(self.shard_sizes):
            owner = rank == len(self.shard_sizes) - 1
            stop = sk if owner else start + size
            keys, values = k[:, :, start:stop], v[:, :, start:stop]
            prefix_end = torch.full((batch, sq), size, dtype=torch.int64, device=q.device)
            segment_start = torch.full((batch, sq), size if owner else stop - start, dtype=torch.int64,
                                       device=q.device)
            out, lse = attention_fn(q, keys, values, prefix_end, segment_start, scale=float(scale),
                                    q_start=stop - start - sq)
            outs.append(out)
            lses.append(lse)
            start += size
        self.calls += 1
        merged, _ = merge_partials(torch.stack(outs), torch.stack(lses))
        return merged


def sharded_decode(model, shards: list[KeptKV], query_ids: torch.Tensor, *, query_position_start: int,
                   max_new_tokens: int) -> torch.Tensor:
    """Greedy phase 2 and decode with every rank's partial merged per layer (``ShardedQueryPhase``)."""
    sizes = [shard[0][0].shape[2] for shard in shards]
    kept = [(torch.cat([s[layer][0] for s in shards], 2), torch.cat([s[layer][1] for s in shards], 2))
            for layer in range(len(shards[0]))]
    return decode(model, kept, query_ids, query_position_start=query_position_start,
                  max_new_tokens=max_new_tokens, make_phase=lambda: ShardedQueryPhase(sizes))


def in_turn_run(model, context_ids, query_ids, config: PulsarConfig, ranks: int, settings: Settings,
                device: torch.device, reference: Reference) -> dict:
    """The ``--ranks-in-turn`` row: every rank's phase 1 timed in turn, phase 2 merged per layer."""
    total = num_blocks(context_ids.numel(), config.block_size)
    rank_ms, shards, tokens_per_rank = [], [], []
    for rank in range(ranks):
        def phase1(rank=rank):
            local = restrict_layout(config.layout(context_ids), rank_blocks(total, ranks, rank))
            return local, encode_context(model, context_ids, local)

        ms, (local, kept) = timed(phase1, device, settings.reps)
        rank_ms.append(ms)
        shards.append(kept)
        tokens_per_rank.append(local.source_index.numel())
    start = local.query_position_start

    def run(new_tokens):
        return sharded_decode(model, shards, query_ids, query_position_start=start, max_new_tokens=new_tokens)

    phase2_ms, _ = timed(lambda: run(1), device, settings.reps)
    full_ms, tokens = timed(lambda: run(settings.new_tokens), device, settings.reps)
    gathered = [(torch.cat([s[layer][0] for s in shards], 2), torch.cat([s[layer][1] for s in shards], 2))
                for layer in range(len(shards[0]))]
    return {"mode": config.mode, "L": context_ids.numel(), "world_size": ranks, "block_size": config.block_size,
            "tokens_per_device": max(tokens_per_rank), "phase1_ms": max(rank_ms), "phase1_rank_ms": rank_ms,
            "phase2_ms": phase2_ms, "decode_ms_per_token": decode_ms(full_ms, phase2_ms, settings.new_tokens),
            "tokens_equal": bool(torch.equal(tokens, reference.tokens)),
            "kv_max_abs_diff": max_abs_diff(gathered, reference.kept), "simulated": True,
            "kv_max_abs": max_abs(reference.kept), "tokens": tokens.tolist()}


def gather_kept_to_rank0(kept: KeptKV, config: PulsarConfig, length: int, world: int,
                         device: torch.device) -> Optional[KeptKV]:
    """Rank 0 receives every rank's kept KV (point to point) and returns it in block order."""
    rank = dist.get_rank()
    if rank != 0:
        for keys, values in kept:
            dist.send(keys.contiguous(), dst=0)
            dist.send(values.contiguous(), dst=0)
        return None
    total = num_blocks(length, config.block_size)
    pieces = [list(kept)]
    for source in range(1, world):
        blocks = rank_blocks(total, world, source)
        size = min(blocks.stop * config.block_size, length) - blocks.start * config.block_size
        received = []
        for keys, values in kept:
            shape = (*keys.shape[:2], size, keys.shape[3])
            got_keys = torch.empty(shape, dtype=keys.dtype, device=device)
            got_values = torch.empty(shape, dtype=values.dtype, device=device)
            dist.recv(got_keys, src=source)
            dist.recv(got_values, src=source)
            received.append((got_keys, got_values))
        pieces.append(received)
    return [(torch.cat([p[layer][0] for p in pieces], 2), torch.cat([p[layer][1] for p in pieces], 2))
            for layer in range(len(kept))]


def distributed_run(model, context_ids, query_ids, config: PulsarConfig, settings: Settings,
                    device: torch.device, reference: Optional[Reference]) -> Optional[dict]:
    """The distributed row (every rank calls it; rank 0, holding ``reference``, returns the row)."""
    world = dist.get_world_size()
    rank_ms, (kept, local, owner) = timed(lambda: encode_rank_context(model, context_ids, config),
                                          device, settings.reps, before=dist.barrier)
    owner_rank = world - 1

    def agree(token):
        dist.broadcast(token, src=owner_rank)
        return token

    def run(new_tokens):
        return decode(model, kept, query_ids, query_position_start=local.query_position_start,
                      max_new_tokens=new_tokens, owner=owner, merge=gather_and_merge(), agree=agree)

    phase2_ms, _ = timed(lambda: run(1), device, settings.reps, before=dist.barrier)
    full_ms, tokens = timed(lambda: run(settings.new_tokens), device, settings.reps, before=dist.barrier)
    all_ms = [None] * world
    dist.all_gather_object(all_ms, (rank_ms, local.source_index.numel(), tokens.tolist()))
    gathered = gather_kept_to_rank0(kept, config, context_ids.numel(), world, device)
    if reference is None:
        return None
    return {"mode": config.mode, "L": context_ids.numel(), "world_size": world, "block_size": config.block_size,
            "tokens_per_device": max(x[1] for x in all_ms), "phase1_ms": max(x[0] for x in all_ms),
            "phase1_rank_ms": [x[0] for x in all_ms], "phase2_ms": phase2_ms,
            "decode_ms_per_token": decode_ms(full_ms, phase2_ms, settings.new_tokens),
            "tokens_equal": all(x[2] == reference.tokens.tolist() for x in all_ms),
            "kv_max_abs_diff": max_abs_diff(gathered, reference.kept), "simulated": False,
            "kv_max_abs": max_abs(reference.kept), "tokens": all_ms[0][2]}


def release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def print_row(row: dict) -> None:
    if "error" in row:
        print(f"{row['mode']:>6} L={row['L']:>6} ranks={row['world_size']} failed: {row['error']}", flush=True)
        return
    print(f"{row['mode']:>6} L={row['L']:>6} ranks={row['world_size']} tokens/device={row['tokens_per_device']:>6} "
          f"phase1 {row['phase1_ms']:9.1f} ms  phase2 {row['phase2_ms']:8.1f} ms  "
          f"tokens_equal={row['tokens_equal']} kv_max_abs_diff={row['kv_max_abs_diff']} "
          f"simulated={row['simulated']}", flush=True)


def mode_rows(model, context_ids, query_ids, config: PulsarConfig, settings: Settings, ranks: int,
              device: torch.device, in_turn: bool, add: Callable[[Optional[dict]], None]) -> None:
    """The rows of one (mode, length): one device, then (star, pulsar) over the ranks."""
    lead = not dist.is_initialized() or dist.get_rank() == 0
    reference = one_device_run(model, context_ids, query_ids, config, settings, device) if lead else None
    add(reference.row if reference is not None else None)
    if config.mode == "dense":
        if dist.is_initialized():
            dist.barrier()
    elif in_turn:
        add(in_turn_run(model, context_ids, query_ids, config, ranks, settings, device, reference))
    else:
        add(distributed_run(model, context_ids, query_ids, config, settings, device, reference))


def benchmark_rows(model, settings: Settings, ranks: int, device: torch.device, in_turn: bool,
                   emit: Callable[[list[dict]], None]) -> list[dict]:
    """All rows: per length, dense on one device, then star and pulsar on one device and over ranks.

    ``emit`` gets the rows so far after every new row (on rank 0 only), so partial runs leave
    results. In one process (``in_turn``) a (mode, length) that raises becomes a row with its
    ``error`` and the others still run; over processes an error ends the run.
    """
    rows: list[dict] = []

    def add(row: Optional[dict]) -> None:
        if row is not None:
            rows.append(row)
            print_row(row)
            emit(rows)

    for length in settings.lengths:
        context_ids, query_ids = workload(length, settings.query_tokens, settings.shape.vocab)
        for mode in settings.modes:
            config = pulsar_config(settings, mode, length, ranks)
            try:
                mode_rows(model, context_ids, query_ids, config, settings, ranks, device, in_turn, add)
            except Exception as error:  # noqa: BLE001 (reported in the row, see the docstring)
                if not in_turn:
                    raise
                add({"mode": mode, "L": length, "world_size": ranks, "simulated": True,
                     "error": f"{type(error).__name__}: {error}"[:1000]})
            release(device)
    return rows


def environment(device: torch.device, backend: Optional[str]) -> dict:
    """The results header (``harness.header``), the process group's backend and the multicast settings."""
    return harness.header(device, backend=backend, multicast_env={k: os.environ.get(k) for k in MULTICAST_OFF})


def timed(fn: Callable[[], object], device: torch.device, reps: int,
          before: Callable[[], None] = lambda: None) -> tuple[float, object]:
    """(median wall ms of ``reps`` synchronised calls after one warm-up, the last result):
    ``harness.measure``, host-paced; ``before`` runs untimed ahead of each call (a barrier)."""
    timing = harness.measure(fn, device, reps, host_paced=True, before=before)
    return timing.ms, timing.out


def markdown(result: dict) -> str:
    s = result["sizes"]
    shape = s["model"]
    versions = result["environment"]["versions"]
    lines = [f"Pulsar over ranks on {result['environment']['device']} ({result['how']}; torch "
             f"{versions['torch']}, transformers {versions.get('transformers')}). "
             f"LlamaForCausalLM, random weights, {shape['layers']} layers of hidden {shape['hidden']}, "
             f"{shape['heads']}/{shape['kv_heads']} heads of dim {shape['head_dim']}, MLP {shape['mlp']}, "
             f"vocab {shape['vocab']}, {s['dtype']}; one block per rank, sink {s['sink']}, chunk {s['chunk']}, "
             f"summary ratio {s['ratio']}; query {s['query_tokens']} tokens, {s['new_tokens']} generated.", "",
             "| mode | L | ranks | tokens/device | phase-1 ms | phase-2 ms | decode ms/token | tokens equal "
             "| kept-KV max abs diff | simulated |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|---|"]

    def fmt(x, spec):
        return "–" if x is None else format(x, spec)

    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['mode']} | {r['L']} | {r['world_size']} | failed: {r['error'][:200]} "
                         "| | | | | | |")
            continue
        lines.append(f"| {r['mode']} | {r['L']} | {r['world_size']} | {r['tokens_per_device']} | "
                     f"{r['phase1_ms']:.1f} | {r['phase2_ms']:.1f} | {fmt(r['decode_ms_per_token'], '.1f')} | "
                     f"{'–' if r['tokens_equal'] is None else r['tokens_equal']} | "
                     f"{fmt(r['kv_max_abs_diff'], '.3g')} | {r['simulated']} |")
    return "\n".join(lines) + "\n"


def write_outputs(result: dict, out: Optional[str], md: Optional[str]) -> None:
    """Write the JSON and Markdown files (when paths are given)."""
    if out:
        harness.write_json(out, result)
    if md:
        with open(md, "w", encoding="utf-8") as fh:
            fh.write(markdown(result))


def run_ranks_in_turn(settings: Settings, ranks: int, device: torch.device, out, md) -> None:
    """One process, one device: the ``--ranks-in-turn`` benchmark."""
    model = compile_model(build_model(settings, device))
    result = {"how": f"{ranks} ranks in turn on one device", "environment": environment(device, None),
              "sizes": sizes(settings, ranks), "rows": []}
    result["rows"] = benchmark_rows(model, settings, ranks, device, True,
                                    lambda rows: write_outputs({**result, "rows": rows}, out, md))
    print(markdown(result), flush=True)


def sizes(settings: Settings, ranks: int) -> dict:
    d = asdict(settings)
    d["model"] = d.pop("shape")
    d["ranks"] = ranks
    d["block_sizes"] = {str(length): math.ceil(length / ranks) for length in settings.lengths}
    return d


def worker(rank: int, world: int, backend: str, device_type: str, settings: Settings, init_method: str,
           out, md) -> None:
    """One rank of the distributed benchmark (spawned, or started by torchrun with ``rank = -1``)."""
    os.environ.update(MULTICAST_OFF)
    if device_type == "cpu":
        torch.set_num_threads(1)
    kwargs = {} if rank < 0 else {"rank": rank, "world_size": world, "init_method": init_method}
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", max(rank, 0)))) if device_type == "cuda" \
        else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10),
                            **({"device_id": device} if device.type == "cuda" else {}), **kwargs)
    try:
        world = dist.get_world_size()
        model = compile_model(build_model(settings, device))
        result = {"how": f"{world} processes, {backend}", "environment": environment(device, backend),
                  "sizes": sizes(settings, world), "rows": []}
        result["rows"] = benchmark_rows(model, settings, world, device, False,
                                        lambda rows: write_outputs({**result, "rows": rows}, out, md))
        if dist.get_rank() == 0:
            print(markdown(result), flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FULL_DEFAULTS = dict(lengths=[65536, 131072], sink=64, chunk=32, ratio=0.125, query_tokens=32, new_tokens=8,
                     reps=3, dtype="bfloat16")
TINY_DEFAULTS = dict(lengths=[128, 192], sink=4, chunk=4, ratio=0.25, query_tokens=5, new_tokens=4, reps=1,
                     dtype="float32")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Command-line options; unset sizes take ``FULL_DEFAULTS``, or ``TINY_DEFAULTS`` with ``--tiny``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--world-size", type=int, help="spawn this many ranks (one device each)")
    how.add_argument("--ranks-in-turn", type=int, help="simulate this many ranks on one device")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default=None,
                        help="process-group backend (default: nccl on cuda, gloo on cpu)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lengths", type=int, nargs="+")
    parser.add_argument("--sink", type=int)
    parser.add_argument("--chunk", type=int)
    parser.add_argument("--ratio", type=float)
    parser.add_argument("--query-tokens", type=int)
    parser.add_argument("--new-tokens", type=int)
    parser.add_argument("--reps", type=int, help="timed repetitions after one warm-up")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"))
    parser.add_argument("--tiny", action="store_true",
                        help=f"tiny model (hidden 64) and sizes {TINY_DEFAULTS} (CPU runs); else {FULL_DEFAULTS}")
    parser.add_argument("--out", default=None, help="JSON result path")
    parser.add_argument("--md", default=None, help="Markdown table path")
    args = parser.parse_args(argv)
    for name, value in (TINY_DEFAULTS if args.tiny else FULL_DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.backend is None:
        args.backend = "nccl" if args.device == "cuda" else "gloo"
    if args.backend == "nccl" and args.device != "cuda":
        parser.error("--backend nccl needs --device cuda")
    for name in ("world_size", "ranks_in_turn", "reps", "new_tokens", "query_tokens", "layers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    shape = ModelShape(layers=args.layers, **(TINY if args.tiny else LLAMA_8B))
    return Settings(shape=shape, lengths=tuple(args.lengths), sink=args.sink, chunk=args.chunk, ratio=args.ratio,
                    query_tokens=args.query_tokens, new_tokens=args.new_tokens, reps=args.reps,
                    dtype=args.dtype, modes=tuple(args.modes))


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    settings = settings_from(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible (use --device cpu --backend gloo)")
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        worker(-1, int(os.environ["WORLD_SIZE"]), args.backend, args.device, settings, "env://",
               args.out, args.md)
    elif args.ranks_in_turn is not None:
        device = torch.device("cuda") if args.device == "cuda" else torch.device("cpu")
        run_ranks_in_turn(settings, args.ranks_in_turn, device, args.out, args.md)
    elif args.world_size is not None:
        if args.device == "cuda" and torch.cuda.device_count() < args.world_size:
            raise SystemExit(f"--world-size {args.world_size}: only {torch.cuda.device_count()} CUDA devices")
        mp.spawn(worker, args=(args.world_size, args.backend, args.device, settings,
                               f"tcp://127.0.0.1:{free_port()}", args.out, args.md),
                 nprocs=args.world_size, join=True)
    else:
        raise SystemExit("give --world-size N, --ranks-in-turn N, or start under torchrun")


if __name__ == "__main__":
    main()
