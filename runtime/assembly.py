"""Phase-1 input assembly for Pulsar, Star and dense attention in one packed layout (SPEC B.3).

``assemble(ids, block_size, mode=, ...)`` packs the assembled inputs into one sequence of P tokens
(``PackedLayout``: source index, position ids, keep mask, segment boundaries). Packed token p sees
packed keys ``[0, prefix_end[p])`` and ``[segment_start[p], p]``. Modes, for blocks B_0 .. B_{n-1}
(``runtime.summaries``): ``pulsar``: ``Input_i = [sink ‖ Σ_0 ‖ … ‖ Σ_{i-1} ‖ B_i]``; ``star``:
``Input_i = [anchor ‖ B_i]`` (the anchor: B_0 or its first ``anchor`` tokens); ``dense``: the whole
context. Inputs follow each other as causal segments; with ``shared_spine=True`` (pulsar) the
spine ``[sink ‖ Σ_0 ‖ … ‖ Σ_{n-2}]`` is packed once, causal on itself, and block i sees its spine
prefix then itself causally: exactly ``Input_i``'s keys and positions. Position ids: ``sparse``
keeps every token's global position (phase-2 queries start at L); ``contiguous`` renumbers each
input from 0 (phase-2 queries start at the longest input's length)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.summaries import (DEFAULT_HEURISTIC, check_positive_int, check_token_ids, num_blocks,
                               select_summaries)

MODES = ("pulsar", "star", "dense")
POSITIONS = ("sparse", "contiguous")


@dataclass(frozen=True, eq=False)
class PackedLayout:
    """Packed phase-1 tokens, every field a 1-D tensor over the P packed tokens unless stated.

    source_index: int64, index of the token in the original sequence.
    position_ids: int64, the position id the model sees.
    keep: bool, the token belongs to its input's own block B_i (its KV is kept after phase 1).
    segment_start, prefix_end: int64 packed key indices of the two-interval rule: token p
        attends to keys [0, prefix_end[p]) ∪ [segment_start[p], p].
    cu_seqlens: int32 [segments + 1], the boundaries of the non-empty segments.
    block_of: int64, the block of the source token (source_index // block_size); for kept
        tokens it is also the block whose input they belong to.
    query_position_start: int, first position id of the phase-2 query tokens.
    Equality is identity (fields are tensors); compare fields with ``torch.equal``.
    """

    source_index: torch.Tensor
    position_ids: torch.Tensor
    keep: torch.Tensor
    segment_start: torch.Tensor
    prefix_end: torch.Tensor
    cu_seqlens: torch.Tensor
    block_of: torch.Tensor
    query_position_start: int

    def visibility(self) -> torch.Tensor:
        """Dense boolean [P, P] mask of the two-interval rule (row: query, column: key); O(P^2)."""
        keys = torch.arange(self.source_index.numel(), device=self.source_index.device)
        query = keys[:, None]
        in_prefix = keys[None, :] < self.prefix_end[:, None]
        in_segment = (keys[None, :] >= self.segment_start[:, None]) & (keys[None, :] <= query)
        return in_prefix | in_segment


def _pack_inputs(inputs: list[torch.Tensor], block_size: int, positions: str, length: int) -> PackedLayout:
    """Layout of independent causal inputs; ``inputs[i]`` holds the source indices of Input_i,
    whose own block is ``i`` (a single dense input owns every block)."""
    lengths = torch.tensor([x.numel() for x in inputs], dtype=torch.int64)
    source = torch.cat(inputs)
    device = source.device
    starts = (torch.cumsum(lengths, 0) - lengths).to(device)
    lengths = lengths.to(device)
    segment = torch.repeat_interleave(torch.arange(len(inputs), device=device), lengths)
    segment_start = starts[segment]
    block_of = source // block_size
    keep = (block_of == segment) if len(inputs) > 1 else torch.ones_like(source, dtype=torch.bool)
    if positions == "sparse":
        position_ids = source.clone()
        query_position_start = length
    else:
        position_ids = torch.arange(source.numel(), device=device) - segment_start
        query_position_start = int(lengths.max())
    cu_seqlens = torch.cat([starts, starts[-1:] + lengths[-1:]]).to(torch.int32)
    return PackedLayout(source, position_ids, keep, segment_start, torch.zeros_like(source),
                        cu_seqlens, block_of, query_position_start)


def _shared_spine_layout(sink: torch.Tensor, summaries: list[torch.Tensor], blocks: list[torch.Tensor],
                         block_size: int, positions: str, length: int) -> PackedLayout:
    """Layout ``[sink ‖ Σ_0 … Σ_{n-2}] B_0 … B_{n-1}`` (module docstring); needs n >= 2."""
    spine_parts = [sink] + summaries[:-1]
    spine = torch.cat(spine_parts)
    device = spine.device
    spine_len = spine.numel()
    part_len = torch.tensor([x.numel() for x in spine_parts], dtype=torch.int64, device=device)
    prefix_of_block = torch.cumsum(part_len, 0)
    prefix_of_block[0] = 0
    block_len = torch.tensor([x.numel() for x in blocks], dtype=torch.int64, device=device)
    block_start = spine_len + torch.cumsum(block_len, 0) - block_len
    block_index = torch.repeat_interleave(torch.arange(len(blocks), device=device), block_len)
    source = torch.cat([spine] + blocks)
    segment_start = torch.cat([torch.zeros(spine_len, dtype=torch.int64, device=device),
                               block_start[block_index]])
    prefix_end = torch.cat([torch.zeros(spine_len, dtype=torch.int64, device=device),
                            prefix_of_block[block_index]])
    keep = torch.cat([torch.zeros(spine_len, dtype=torch.bool, device=device),
                      torch.ones(int(block_len.sum()), dtype=torch.bool, device=device)])
    packed = torch.arange(source.numel(), device=device)
    if positions == "sparse":
        position_ids = source.clone()
        query_position_start = length
    else:
        position_ids = torch.where(keep, prefix_end + packed - segment_start, packed)
        query_position_start = int((prefix_of_block + block_len).max())
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), block_start,
                        block_start[-1:] + block_len[-1:]])
    bounds = bounds[1:] if spine_len == 0 else bounds
    return PackedLayout(source, position_ids, keep, segment_start, prefix_end,
                        bounds.to(torch.int32), source // block_size, query_position_start)


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def assemble(token_ids: torch.Tensor, block_size: int, *, mode: str = "pulsar", sink: int = 64,
             anchor: int | None = None, chunk: int = 32, ratio: float = 0.125,
             heuristic: str = DEFAULT_HEURISTIC, positions: str = "sparse",
             shared_spine: bool = False, tie_break: str = "position") -> PackedLayout:
    """Pack the phase-1 inputs of ``mode`` for the 1-D integer ``token_ids`` [L].

    ``sink``, ``chunk``, ``ratio``, ``heuristic``, ``tie_break`` set the pulsar summaries
    (``runtime.summaries.select_summaries``); ``anchor`` (star only) is the anchor length, None
    for the whole first block; ``shared_spine`` applies to pulsar only. Tensors are created on
    ``token_ids.device``.
    """
    check_token_ids(token_ids)
    check_positive_int("block_size", block_size)
    _check_choice("mode", mode, MODES)
    _check_choice("positions", positions, POSITIONS)
    if not isinstance(shared_spine, bool):
        raise TypeError(f"shared_spine must be a bool, got {type(shared_spine).__name__}")
    if shared_spine and mode != "pulsar":
        raise ValueError(f"shared_spine=True applies to mode='pulsar' only, got mode={mode!r}")
    if anchor is not None:
        if mode != "star":
            raise ValueError(f"anchor applies to mode='star' only, got mode={mode!r}")
        check_positive_int("anchor", anchor)
        if anchor > block_size:
            raise ValueError(f"anchor must be <= block_size={block_size}, got {anchor}")
    length = token_ids.numel()
    device = token_ids.device
    everything = torch.arange(length, device=device)
    if mode == "dense":
        return _pack_inputs([everything], block_size, positions, length)
    blocks = list(torch.split(everything, block_size))
    if mode == "star":
        head = blocks[0][: (block_size if anchor is None else anchor)]
        return _pack_inputs([blocks[0]] + [torch.cat([head, b]) for b in blocks[1:]], block_size, positions,
                            length)
    summaries = select_summaries(token_ids, block_size, heuristic=heuristic, chunk=chunk,
                                 ratio=ratio, sink=sink, tie_break=tie_break)
    if num_blocks(length, block_size) == 1:
        return _pack_inputs(blocks, block_size, positions, length)
    sink_tokens = blocks[0][:sink]
    if shared_spine:
        return _shared_spine_layout(sink_tokens, summaries, blocks, block_size, positions, length)
    inputs = [blocks[0]] + [torch.cat([sink_tokens, *summaries[:i], blocks[i]]) for i in range(1, len(blocks))]
    return _pack_inputs(inputs, block_size, positions, length)
