"""Pulsar over ranks with torch.distributed (any backend whose tensors live on the model's device).

Blocks are dealt to ranks in contiguous runs (the first ``n % world`` ranks get one more block).
Every rank computes the same packed layout from the full context ids (pure integer work) and keeps
the part its blocks need (``restrict_layout``): phase 1 runs with no communication. In phase 2 and
decode every rank runs the model on the new tokens; in every attention layer each rank attends over
its own kept KV, the partials ``(o, lse)`` are all-gathered and merged exactly
(``runtime.lse_merge.merge_partials``), so every rank continues with the same hidden states. The
new tokens' KV is kept on one owner rank (the one holding the last block) and seen only there; the
owner's greedy choice is broadcast so all ranks stop together.

Before any model work the ranks all-gather a digest of their arguments (``check_same_arguments``):
a rank given bad arguments, or ranks given different contexts, queries, configurations, stop ids
or models, make every rank raise the same clear error instead of failing inside a collective.
"""
from __future__ import annotations

import hashlib
from typing import Optional

import torch
import torch.distributed as dist

from runtime.assembly import PackedLayout
from runtime.attention_layout import MergeFn
from runtime.lse_merge import merge_partials
from runtime.process_group import checked_world_size
from runtime.pulsar import (GenerateArgs, KeptKV, PulsarConfig, StopIds, decode, encode_context, is_compiled,
                            prepare_generate_args)
from runtime.summaries import num_blocks


def rank_blocks(total_blocks: int, world_size: int, rank: int) -> range:
    """The contiguous run of block indices that ``rank`` of ``world_size`` encodes."""
    if world_size > total_blocks:
        raise ValueError(f"world_size ({world_size}) must not exceed the number of blocks ({total_blocks}): "
                         "every rank needs at least one block")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    base, extra = divmod(total_blocks, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def restrict_layout(layout: PackedLayout, blocks: range) -> PackedLayout:
    """The sub-layout holding the kept tokens of ``blocks`` and every token they may attend to.

    Packed order and position ids are preserved, indices renumbered; the two-interval rule of
    every selected token must stay inside the selection (it does for ``runtime.assembly``
    layouts: the keys a kept token sees only see keys it sees), else ValueError.
    """
    packed = layout.source_index.numel()
    device = layout.source_index.device
    owned = layout.keep & (layout.block_of >= blocks.start) & (layout.block_of < blocks.stop)
    if not bool(owned.any()):
        raise ValueError(f"blocks {blocks} hold no kept token of the layout")
    rows = torch.nonzero(owned).flatten()
    ones = torch.ones_like(rows)
    delta = torch.zeros(packed + 1, dtype=torch.int64, device=device)
    delta.index_add_(0, torch.zeros_like(rows), ones)
    delta.index_add_(0, layout.prefix_end[rows], -ones)
    delta.index_add_(0, layout.segment_start[rows], ones)
    delta.index_add_(0, rows + 1, -ones)
    needed = torch.cumsum(delta, 0)[:packed] > 0
    before = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), torch.cumsum(needed, 0)])
    picked = torch.nonzero(needed).flatten()
    prefix_end, segment_start = layout.prefix_end[picked], layout.segment_start[picked]
    inside = (before[prefix_end] == prefix_end) & (before[picked + 1] - before[segment_start]
                                                   == picked + 1 - segment_start)
    if not bool(inside.all()):
        raise ValueError("layout is not closed under visibility: a needed token sees a token outside "
                         f"the keys of blocks {blocks}")
    new_segment_start = before[segment_start]
    bounds = torch.cat([torch.unique(new_segment_start),
                        torch.tensor([picked.numel()], dtype=torch.int64, device=device)])
    return PackedLayout(source_index=layout.source_index[picked], position_ids=layout.position_ids[picked],
                        keep=owned[picked], segment_start=new_segment_start,
                        prefix_end=before[prefix_end], cu_seqlens=bounds.to(torch.int32),
                        block_of=layout.block_of[picked], query_position_start=layout.query_position_start)


def gather_and_merge(group: Optional[dist.ProcessGroup] = None) -> MergeFn:
    """A merge function: all-gather every rank's partial ``(o, lse)`` and merge them exactly."""
    def merge(out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        world = dist.get_world_size(group)
        outs = [torch.empty_like(out) for _ in range(world)]
        lses = [torch.empty_like(lse) for _ in range(world)]
        dist.all_gather(outs, out.contiguous(), group=group)
        dist.all_gather(lses, lse.contiguous(), group=group)
        return merge_partials(torch.stack(outs), torch.stack(lses))
    return merge


def encode_rank_context(model: torch.nn.Module, context_ids: torch.Tensor, config: PulsarConfig,
                        group: Optional[dist.ProcessGroup] = None) -> tuple[KeptKV, PackedLayout, bool]:
    """Phase 1 of this rank's blocks: ``(kept KV, its layout, whether this rank owns new tokens)``."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    layout = config.layout(context_ids)
    total = num_blocks(context_ids.numel(), config.block_size)
    local = restrict_layout(layout, rank_blocks(total, world, rank))
    return encode_context(model, context_ids, local), local, rank == world - 1


def model_fingerprint(model: torch.nn.Module) -> str:
    """A digest of the model's class and parameter names, shapes and dtypes (not their values)."""
    inner = model._orig_mod if is_compiled(model) else model
    parts = [type(inner).__qualname__] + [f"{name}:{tuple(p.shape)}:{p.dtype}" for name, p in inner.named_parameters()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def check_same_arguments(model: torch.nn.Module, args: GenerateArgs | Exception,
                         group: Optional[dist.ProcessGroup] = None) -> None:
    """All-gather every rank's argument digests (or its argument error) and raise on every rank
    unless all ranks hold valid, identical arguments and models of the same shapes.

    ``args``: this rank's checked arguments, or the TypeError/ValueError they raised (re-raised
    here, after the exchange, so no rank is left waiting). Uses ``dist.all_gather_object``
    (with NCCL, the current CUDA device must be this rank's device).
    """
    if isinstance(args, Exception):
        mine: dict[str, str] | str = f"{type(args).__name__}: {args}"
    else:
        mine = {**args.fingerprint(), "model": model_fingerprint(model)}
    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    if isinstance(args, Exception):
        raise args
    failed = {rank: error for rank, error in enumerate(gathered) if isinstance(error, str)}
    if failed:
        raise ValueError("generate_distributed: bad arguments on rank(s) "
                         + "; ".join(f"{rank}: {error}" for rank, error in failed.items()))
    differing = [name for name in mine if len({digests[name] for digests in gathered}) > 1]
    if differing:
        def ranks_by_value(name: str) -> str:
            values = list(dict.fromkeys(digests[name] for digests in gathered))  # in order of first rank
            return ", ".join(f"ranks {[r for r, d in enumerate(gathered) if d[name] == value]}" for value in values)

        detail = "; ".join(f"{name}: {ranks_by_value(name)}" for name in differing)
        raise ValueError(f"generate_distributed needs the same arguments on every rank, but "
                         f"{', '.join(differing)} differ ({detail})")


def generate_distributed(model: torch.nn.Module, context_ids: torch.Tensor, query_ids: torch.Tensor,
                         config: PulsarConfig, *, max_new_tokens: int, stop_ids: StopIds = None,
                         group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """``runtime.pulsar.generate`` with the blocks sharded over the ranks of ``group``.

    Call on every rank with the same arguments (the process group must be initialised); every
    rank returns the same generated ids (1-D int64). Arguments follow ``generate`` (ids [L] or
    [1, L], ``stop_ids`` None for the model's eos ids); bad or differing arguments raise the same
    error on every rank before any model work (``check_same_arguments``); a ``group`` that is not
    an initialised process group of this process raises first, naming it.
    """
    checked_world_size(group)
    try:
        args: GenerateArgs | Exception = prepare_generate_args(model, context_ids, query_ids, config,
                                                               max_new_tokens, stop_ids)
    except (TypeError, ValueError) as error:
        args = error
    check_same_arguments(model, args, group)
    kept, local, owner = encode_rank_context(model, args.context_ids, config, group)
    owner_rank = dist.get_global_rank(group or dist.group.WORLD, dist.get_world_size(group) - 1)

    def agree(token: torch.Tensor) -> torch.Tensor:
        dist.broadcast(token, src=owner_rank, group=group)
        return token

    return decode(model, kept, args.query_ids, query_position_start=local.query_position_start,
                  max_new_tokens=args.max_new_tokens, stop_ids=args.stop_ids, owner=owner,
                  merge=gather_and_merge(group), agree=agree)
