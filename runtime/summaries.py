"""Pulsar block summaries: chunk-group scores and selection (SPEC B.2, C.10).

``select_summaries(ids, block_size, *, chunk=32, ratio=0.125, sink=64, heuristic="max_idf",
tie_break="position")``: for each block of the token ids [L], the positions (ascending) of its
best-scoring chunk groups within a budget of floor(ratio * |B_i|) tokens; the first ``sink`` tokens
are never candidates. ``score_chunk_groups`` gives the scores. Heuristics: ``max_idf`` (the
default, ``DEFAULT_HEURISTIC``), ``tfidf``, ``bm25``, ``entropy``, ``novelty`` (unique tokens and
unique adjacent pairs over the whole context, best centred window: SPEC C.10) and ``uniform``.
Pure integer work on token ids before any model computation, O(L) in time and memory whatever the
ids, no read of device data by the host but the id check; every device selects the same groups."""
from __future__ import annotations

from fractions import Fraction
from functools import cached_property, lru_cache
from typing import Callable, NamedTuple

import torch

HEURISTICS = ("max_idf", "tfidf", "bm25", "entropy", "novelty", "uniform")
SCORED_HEURISTICS = ("max_idf", "tfidf", "bm25", "entropy", "novelty")
DEFAULT_HEURISTIC = "max_idf"
TIE_BREAKS = ("position", "tfidf")
BM25_K1 = 1.2
BM25_B = 0.75
RATIO_MAX_DENOMINATOR = 10**6


class ChunkGroupScores(NamedTuple):
    """Every chunk group of a sequence, in position order (blocks ascending, groups ascending).

    ``block``, ``start``, ``length``: int64 [G] (block index, first position, token count);
    ``score``: float64 [G] under one heuristic.
    """

    block: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor
    score: torch.Tensor


def check_token_ids(token_ids: torch.Tensor) -> None:
    """Raise unless ``token_ids`` is a non-empty 1-D tensor of non-negative integers."""
    if not isinstance(token_ids, torch.Tensor):
        raise TypeError(f"token_ids must be a torch.Tensor, got {type(token_ids).__name__}")
    if token_ids.dim() != 1:
        raise ValueError(f"token_ids must be 1-D [L], got shape {tuple(token_ids.shape)}")
    if token_ids.dtype == torch.bool or token_ids.dtype.is_floating_point or token_ids.dtype.is_complex:
        raise TypeError(f"token_ids must have an integer dtype, got {token_ids.dtype}")
    if token_ids.numel() == 0:
        raise ValueError("token_ids must hold at least one token, got an empty tensor")
    lowest = int(token_ids.min())
    if lowest < 0:
        raise ValueError(f"token_ids must be non-negative, got min {lowest}")


def check_positive_int(name: str, value: object) -> None:
    """Raise unless ``value`` (the argument ``name``) is an int > 0 (bool rejected)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")


def _check_sink(sink: object, block_size: int) -> None:
    if isinstance(sink, bool) or not isinstance(sink, int):
        raise TypeError(f"sink must be an int, got {type(sink).__name__}")
    if not 0 <= sink <= block_size:
        raise ValueError(f"sink must be in [0, block_size={block_size}], got {sink}")


def _check_ratio(ratio: object) -> None:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        raise TypeError(f"ratio must be a float, got {type(ratio).__name__}")
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"ratio must be in (0, 1], got {ratio}")


def _check_heuristic(heuristic: object, allowed: tuple[str, ...]) -> None:
    if heuristic not in allowed:
        raise ValueError(f"heuristic must be one of {allowed}, got {heuristic!r}")


def num_blocks(length: int, block_size: int) -> int:
    """Number of blocks ``ceil(length / block_size)`` of a sequence of ``length`` tokens."""
    return -(-length // block_size)


def _budget(block_len: int, ratio: float, chunk: int) -> int:
    """Groups a block of ``block_len`` tokens may select: ``floor(floor(ratio * block_len) / chunk)``
    with ``ratio`` read as an exact fraction (module docstring)."""
    exact = Fraction(ratio).limit_denominator(RATIO_MAX_DENOMINATOR)
    return block_len * exact.numerator // exact.denominator // chunk


class _Grid(NamedTuple):
    """Blocks and chunk groups in Python ints, the groups laid out as a table: row i holds block
    i's groups left-aligned in ``width`` slots (the most groups of any block) of ``group_cells``
    cells (``chunk``, or fewer when no block has ``chunk`` candidates), block i's candidate
    number q (0-based, in reading order) in cell q of the row. Slots and cells past a block's
    candidates are padding. Blocks 1 .. blocks - 2 are all alike."""

    length: int
    block_size: int
    chunk: int
    first0: int  # first candidate of block 0: min(sink, length)
    blocks: int
    width: int
    group_cells: int

    def first(self, i: int) -> int:
        """First candidate position of block i."""
        return max(i * self.block_size, self.first0)

    def end(self, i: int) -> int:
        """End (exclusive) of block i."""
        return min((i + 1) * self.block_size, self.length)

    def candidates(self, i: int) -> int:
        """Candidates of block i."""
        return self.end(i) - self.first(i)

    def groups(self, i: int) -> int:
        """Chunk groups of block i."""
        return -(-self.candidates(i) // self.chunk)

    def kinds(self) -> tuple[int, ...]:
        """One block of each kind: block 0, a middle block when there is one, the last block."""
        return tuple(sorted({0, min(1, self.blocks - 1), self.blocks - 1}))

    def rows(self, kind: int) -> slice:
        """The rows (blocks) of one of ``kinds()``."""
        if kind == 0:
            return slice(0, 1)
        if kind == self.blocks - 1:
            return slice(kind, kind + 1)
        return slice(1, self.blocks - 1)

    def count(self, kind: int) -> int:
        """Blocks of one of ``kinds()``."""
        return self.rows(kind).stop - self.rows(kind).start

    def per_block(self, value: dict[int, int]) -> list[int]:
        """``value[kind]`` for every block, from a value per kind."""
        out = [0] * self.blocks
        for kind in self.kinds():
            out[self.rows(kind)] = [value[kind]] * self.count(kind)
        return out

    @property
    def slots(self) -> int:
        return self.blocks * self.width

    @property
    def cells(self) -> int:
        return self.slots * self.group_cells


def _grid(length: int, block_size: int, chunk: int, sink: int) -> _Grid:
    grid = _Grid(length, block_size, chunk, min(sink, length), num_blocks(length, block_size), 0, 0)
    return grid._replace(width=max(grid.groups(i) for i in grid.kinds()),
                         group_cells=min(chunk, max(grid.candidates(i) for i in grid.kinds())))


def _per_block_tensor(grid: _Grid, value: Callable[[int], int], device: torch.device) -> torch.Tensor:
    """int64 [blocks]: ``value(i)`` for every block i, ``value`` being alike on the middle blocks."""
    base = value(grid.blocks - 1)
    out = torch.full((grid.blocks,), base, dtype=torch.int64, device=device)
    for kind in grid.kinds():
        if value(kind) != base:
            out[grid.rows(kind)] = value(kind)
    return out


def _block_firsts(grid: _Grid, device: torch.device) -> torch.Tensor:
    """First candidate position of every block, int64 [blocks]."""
    return torch.arange(0, grid.blocks * grid.block_size, grid.block_size, device=device).clamp_(min=grid.first0)


def _cells(grid: _Grid, device: torch.device) -> torch.Tensor:
    """Table cell of every position, int64 [L]: candidate q of block i goes to cell
    ``i * width * group_cells + q``; a sink position p goes to the spare cell ``grid.cells + p``."""
    row = grid.width * grid.group_cells
    cell = torch.arange(grid.length, device=device)
    if row != grid.block_size:
        cell += torch.div(cell, grid.block_size, rounding_mode="floor") * (row - grid.block_size)
    if grid.first0:
        cell[:grid.block_size].sub_(grid.first0)
        cell[:grid.first0].add_(grid.cells + grid.first0)
    return cell


def _lay_out(grid: _Grid, cell: torch.Tensor, values: torch.Tensor, pad: float | int) -> torch.Tensor:
    """[slots, group_cells] table holding ``values[j]`` at cell ``cell[j]`` and ``pad`` in the
    padding; values at sink cells are dropped."""
    table = values.new_full((grid.cells + grid.first0,), pad)
    table.scatter_(0, cell, values)
    return table[:grid.cells].view(grid.slots, grid.group_cells)


def _run_starts(ascending: torch.Tensor) -> torch.Tensor:
    """bool [N + 1] for sorted values [N]: entry i starts a run of equal values; entry N is True."""
    starts = torch.ones(ascending.numel() + 1, dtype=torch.bool, device=ascending.device)
    torch.ne(ascending[1:], ascending[:-1], out=starts[1:-1])
    return starts


class _Tokens:
    """The token ids sorted once, stably (positions ascend within an id), and what is read from
    that order, each computed on first use. Per-entry tensors are in sorted order unless said.
    Only equality of ids is used: time and memory are O(L) (sorts aside) whatever the ids are."""

    def __init__(self, token_ids: torch.Tensor):
        self.length = token_ids.numel()
        self.device = token_ids.device
        self.ids, self.order = torch.sort(token_ids.to(torch.int64), stable=True)

    @cached_property
    def run_start(self) -> torch.Tensor:
        """bool [L + 1]: entry i is the first of its id; entry L is True."""
        return _run_starts(self.ids)

    @cached_property
    def rank(self) -> torch.Tensor:
        """int64 [L]: rank 1..U of each entry's id among the U distinct ids."""
        return torch.cumsum(self.run_start[:-1], 0)

    def unsort(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` given per entry, returned in position order."""
        out = torch.empty_like(values)
        out[self.order] = values
        return out

    def pair_start(self, key: torch.Tensor) -> torch.Tensor:
        """bool [L]: entry i is the first of its (id, ``key[i]``) pair; ``key`` (int64 [L]) must keep
        the entries of each pair adjacent, as does any key that, read along the positions, never
        returns to a value it has left."""
        starts = torch.ones(self.length, dtype=torch.bool, device=self.device)
        torch.ne(key[1:], key[:-1], out=starts[1:])
        return starts.logical_or_(self.run_start[:-1])

    def document_frequency(self, block_size: int) -> torch.Tensor:
        """int64 [L]: the number of blocks holding each entry's id."""
        new_block = self.pair_start(torch.div(self.order, block_size, rounding_mode="floor"))
        per_id = torch.zeros(self.length + 1, dtype=torch.int64, device=self.device)
        per_id.index_add_(0, self.rank, new_block.to(torch.int64))
        return per_id[self.rank]

    @cached_property
    def novelty_weight(self) -> torch.Tensor:
        """int64 [L] in position order: [t_p occurs once] + [p > 0 and (t_{p-1}, t_p) occurs once]."""
        weight = self.unsort(self.run_start[:-1] & self.run_start[1:]).to(torch.int64)
        if self.length > 1:
            rank = self.unsort(self.rank)
            pairs, pair_order = torch.sort(rank[:-1] * (self.length + 1) + rank[1:])
            starts = _run_starts(pairs)
            once = torch.empty(self.length - 1, dtype=torch.bool, device=self.device)
            once[pair_order] = starts[:-1] & starts[1:]
            weight[1:].add_(once)
        return weight


def _on_device(table: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU table on ``device``; to CUDA through pinned memory, so the copy does not wait."""
    if device.type == "cuda":
        return table.pin_memory().to(device, non_blocking=True)
    return table.to(device)


@lru_cache(maxsize=64)
def _cpu_idf_tables(blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 [blocks + 1] each, on the CPU, never modified: entry d >= 1 of the first is
    log(blocks / d), the IDF of an id found in d blocks, clamped at 0 (for d = blocks it may round
    just below); of the second BM25's IDF log((N - d + 0.5) / (d + 0.5) + 1) > 0 with N = blocks."""
    found_in = torch.arange(blocks + 1, dtype=torch.float64).clamp_(min=1)
    idf = torch.log(blocks / found_in).clamp_(min=0.0)
    return idf, torch.log((float(blocks) - found_in + 0.5) / (found_in + 0.5) + 1.0)


def _idf_table(blocks: int, device: torch.device) -> torch.Tensor:
    """The IDF table of ``_cpu_idf_tables`` on ``device`` (the same values on every device)."""
    return _on_device(_cpu_idf_tables(blocks)[0], device)


def _bm25_idf_table(blocks: int, device: torch.device) -> torch.Tensor:
    """BM25's IDF table of ``_cpu_idf_tables`` on ``device`` (the same values on every device)."""
    return _on_device(_cpu_idf_tables(blocks)[1], device)


class _Scoring:
    """A sequence's sorted tokens and chunk-group grid, with the quantities the heuristics share
    (each computed on first use). Scores are float64 [slots]; those of the padding slots mean
    nothing."""

    def __init__(self, token_ids: torch.Tensor, grid: _Grid):
        self.tokens = _Tokens(token_ids)
        self.grid = grid
        self.device = token_ids.device

    @cached_property
    def cell(self) -> torch.Tensor:
        """Table cell of every position (``_cells``)."""
        return _cells(self.grid, self.device)

    @cached_property
    def sorted_cell(self) -> torch.Tensor:
        """Table cell of every sorted entry."""
        return self.cell[self.tokens.order]

    @cached_property
    def document_frequency(self) -> torch.Tensor:
        return self.tokens.document_frequency(self.grid.block_size)

    @cached_property
    def idf(self) -> torch.Tensor:
        """float64 [L]: IDF of every sorted entry's id."""
        return _idf_table(self.grid.blocks, self.device)[self.document_frequency]

    @cached_property
    def lengths(self) -> torch.Tensor:
        """int64 [slots]: tokens in each slot's group, 0 in the padding slots."""
        grid = self.grid
        span = _per_block_tensor(grid, grid.candidates, self.device)
        offset = torch.arange(0, grid.width * grid.chunk, grid.chunk, device=self.device)
        return (span[:, None] - offset).clamp_(0, grid.chunk).view(-1)

    def lay_out(self, values: torch.Tensor, pad: float | int) -> torch.Tensor:
        """``_lay_out`` of values given per sorted entry."""
        return _lay_out(self.grid, self.sorted_cell, values, pad)


def _canonical_sum(table: torch.Tensor) -> torch.Tensor:
    """Row sums of a table of values >= 0 in one fixed order: each row sorted in descending order,
    zero-padded to a power-of-two width and folded in halves (``row[:h] + row[h:]``) down to one
    column. The sum depends only on the multiset of a row's values (the zeros trail, and
    trailing zeros fold away exactly), and the same float64 additions run on every device,
    whatever its own reduction order."""
    rows = torch.sort(table, dim=1, descending=True).values
    width = 1 << (rows.shape[1] - 1).bit_length()
    if width != rows.shape[1]:
        rows = torch.nn.functional.pad(rows, (0, width - rows.shape[1]))
    while width > 1:
        width //= 2
        rows = rows[:, :width] + rows[:, width:]
    return rows[:, 0]


def _max_idf(s: _Scoring) -> torch.Tensor:
    return s.lay_out(s.idf, 0.0).amax(dim=1)


def _tfidf(s: _Scoring) -> torch.Tensor:
    return _canonical_sum(s.lay_out(s.idf, 0.0)) / s.lengths.clamp(min=1).to(torch.float64)


def _sorted_slot_starts(s: _Scoring) -> torch.Tensor:
    """bool [L]: the sorted entry is the first of its id in its chunk group."""
    return s.tokens.pair_start(torch.div(s.sorted_cell, s.grid.group_cells, rounding_mode="floor"))


def _entropy(s: _Scoring) -> torch.Tensor:
    distinct = s.lay_out(_sorted_slot_starts(s).to(torch.int64), 0).sum(dim=1)
    return distinct.to(torch.float64) / s.lengths.clamp(min=1).to(torch.float64)


def _bm25(s: _Scoring) -> torch.Tensor:
    grid = s.grid
    starts = _sorted_slot_starts(s)
    pair = torch.cumsum(starts, 0)
    occurrences = torch.zeros(grid.length + 1, dtype=torch.int64, device=s.device)
    occurrences.index_add_(0, pair, torch.ones_like(pair))
    tf = s.lay_out(torch.where(starts, occurrences[pair], 0).to(torch.float64), 0.0)
    idf = s.lay_out(_bm25_idf_table(grid.blocks, s.device)[s.document_frequency], 0.0)
    groups = sum(grid.groups(kind) * grid.count(kind) for kind in grid.kinds())
    mean_len = torch.full((), (grid.length - grid.first0) / groups, dtype=torch.float64, device=s.device)
    norm = BM25_K1 * (1.0 - BM25_B + BM25_B * s.lengths.to(torch.float64) / mean_len)
    return _canonical_sum(idf * tf * (BM25_K1 + 1.0) / (tf + norm[:, None]))


def _novelty(s: _Scoring) -> torch.Tensor:
    """(2m + 1) * span + own per group, exact integers as float64 (module docstring).

    Windows are summed along each block's row of the table, zero-padded on both sides: a zero
    weight outside the block's candidates is the same as clipping the window to them, and a
    window centred on a padding cell never exceeds the one centred on the block's last candidate."""
    grid, chunk = s.grid, s.grid.chunk
    weight = _lay_out(grid, s.cell, s.tokens.novelty_weight, 0)
    row = weight.view(grid.blocks, grid.width * grid.group_cells)
    total = torch.nn.functional.pad(row, (chunk // 2 + 1, chunk - chunk // 2)).cumsum(dim=1)
    window = (total[:, chunk:-1] - total[:, :-chunk - 1]).view(grid.slots, grid.group_cells)
    return (window.amax(dim=1) * (2 * chunk + 1) + weight.sum(dim=1)).to(torch.float64)


_SCORERS = {"max_idf": _max_idf, "tfidf": _tfidf, "bm25": _bm25, "entropy": _entropy, "novelty": _novelty}


def position_idf(token_ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """IDF(t_p) = log(n / df(t_p)) of the token at every position p, float64 [L] (SPEC B.2).

    df(t) counts the blocks holding t (repeats inside a block count once); with a single block
    every entry is 0. Time and memory are O(L) whatever the token ids are.
    """
    check_token_ids(token_ids)
    check_positive_int("block_size", block_size)
    tokens = _Tokens(token_ids)
    table = _idf_table(num_blocks(token_ids.numel(), block_size), token_ids.device)
    return tokens.unsort(table[tokens.document_frequency(block_size)])


def novelty_weights(token_ids: torch.Tensor) -> torch.Tensor:
    """Novelty weight of every position, int64 [L] with values in {0, 1, 2}:
    [t_p occurs once in the sequence] + [p > 0 and the pair (t_{p-1}, t_p) occurs once]."""
    check_token_ids(token_ids)
    return _Tokens(token_ids).novelty_weight


def score_chunk_groups(token_ids: torch.Tensor, block_size: int, *, heuristic: str = DEFAULT_HEURISTIC,
                       chunk: int = 32, sink: int = 64) -> ChunkGroupScores:
    """Score every chunk group with one of ``SCORED_HEURISTICS`` (module docstring, SPEC B.2).

    max_idf = max IDF over the group; tfidf = mean IDF over its tokens; entropy = distinct tokens
    / |C|; bm25 with k1 = 1.2, b = 0.75, N = n blocks and l̄ = the mean length of all groups;
    novelty = (2·chunk + 1) · span + own, integers (module docstring).
    Sums are taken in one fixed order on every device (module docstring), so two groups whose
    terms are the same multiset score bit-identically and tie exactly; max_idf, entropy and
    novelty ties are always exact. Time and memory are O(L) in the sequence length (sorts aside),
    never in the token ids.
    """
    check_token_ids(token_ids)
    check_positive_int("block_size", block_size)
    check_positive_int("chunk", chunk)
    _check_sink(sink, block_size)
    _check_heuristic(heuristic, SCORED_HEURISTICS)
    grid = _grid(token_ids.numel(), block_size, chunk, sink)
    device = token_ids.device
    if grid.width == 0:  # the sink is the whole sequence
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return ChunkGroupScores(empty, empty, empty, empty.to(torch.float64))
    scoring = _Scoring(token_ids, grid)
    score = _SCORERS[heuristic](scoring)
    block = torch.arange(grid.blocks, device=device).repeat_interleave(grid.width)
    start = (_block_firsts(grid, device)[:, None] + torch.arange(grid.width, device=device) * chunk).view(-1)
    real = scoring.lengths > 0
    return ChunkGroupScores(block[real], start[real], scoring.lengths[real], score[real])


def _chosen_slots(grid: _Grid, score: torch.Tensor, secondary: torch.Tensor | None,
                  take: dict[int, int]) -> torch.Tensor:
    """int64 [blocks, max(take)]: per block, the slots of its ``take[kind]`` best groups in
    ascending order, then ``width`` in the places left over. Best = higher score, then (when
    given) higher secondary, then the earlier slot (chained stable sorts). ``score`` is
    overwritten with -inf in the padding slots, which thus come after every group."""
    score = score.view(grid.blocks, grid.width)
    for kind in grid.kinds():
        if grid.groups(kind) < grid.width:
            score[grid.rows(kind), grid.groups(kind):] = -torch.inf
    order = None
    if secondary is not None:
        order = torch.sort(secondary.view(grid.blocks, grid.width), dim=1, descending=True, stable=True).indices
        score = score.gather(1, order)
    most = max(take.values())
    best = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :most]
    if order is not None:
        best = order.gather(1, best)
    for kind, count in take.items():
        if count < most:
            best[grid.rows(kind), count:] = grid.width
    return torch.sort(best, dim=1).values


def _block_rows(rows: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """The first ``sizes[i]`` entries of row i of ``rows`` [blocks, R], for every row (views)."""
    width = rows.shape[1]
    return list(rows.reshape(-1).split([part for size in sizes for part in (size, width - size)])[::2])


def _summary_sizes(grid: _Grid, take: dict[int, int], positions: torch.Tensor) -> list[int]:
    """Tokens in each block's summary: ``take`` groups of ``chunk`` tokens, less what the block's
    shorter last group lacks when it is among them. Read from ``positions`` ([blocks, R], each
    row's valid entries first, then entries at or past the block's end) only when some block's
    shorter last group may or may not be chosen."""
    sizes = {}
    for kind, count in take.items():
        groups, short = grid.groups(kind), grid.candidates(kind) % grid.chunk
        if short and 0 < count < groups:
            ends = torch.arange(grid.block_size, (grid.blocks + 1) * grid.block_size, grid.block_size,
                                device=positions.device).clamp_(max=grid.length)
            return (positions < ends[:, None]).sum(dim=1).tolist()
        sizes[kind] = count * grid.chunk - (grid.chunk - short if short and count == groups > 0 else 0)
    return grid.per_block(sizes)


def _uniform_positions(grid: _Grid, ratio: float, device: torch.device) -> list[torch.Tensor]:
    """floor(linspace(first, end - 1, s_i)) per block in exact integer arithmetic, s_i = k_i * chunk
    capped at the block's candidates."""
    def count(i: int) -> int:
        return min(_budget(grid.end(i) - i * grid.block_size, ratio, grid.chunk) * grid.chunk, grid.candidates(i))

    most = max(count(kind) for kind in grid.kinds())
    gaps = _per_block_tensor(grid, lambda i: grid.candidates(i) - 1, device)
    steps = _per_block_tensor(grid, lambda i: max(count(i) - 1, 1), device)
    step = torch.arange(most, device=device)
    rows = _block_firsts(grid, device)[:, None] + step * gaps[:, None] // steps[:, None]
    return _block_rows(rows, grid.per_block({kind: count(kind) for kind in grid.kinds()}))


def select_summaries(token_ids: torch.Tensor, block_size: int, *, heuristic: str = DEFAULT_HEURISTIC,
                     chunk: int = 32, ratio: float = 0.125, sink: int = 64,
                     tie_break: str = "position") -> list[torch.Tensor]:
    """Summary of every block: ascending int64 positions into ``token_ids`` (one tensor per block).

    ``token_ids``: 1-D non-negative integer tensor [L]. ``heuristic``: one of
    ``SCORED_HEURISTICS`` (top ``k_i`` chunk groups per block, ties resolved by ``tie_break``:
    module docstring) or ``uniform`` (``floor(linspace)`` over the block's candidates,
    ``k_i * chunk`` tokens, capped at the number of candidates; no ties). Positions lie in their
    own block and never in the sink. Time and memory are O(L) (sorts aside), whatever the ids.
    """
    check_token_ids(token_ids)
    check_positive_int("block_size", block_size)
    check_positive_int("chunk", chunk)
    _check_ratio(ratio)
    _check_sink(sink, block_size)
    _check_heuristic(heuristic, HEURISTICS)
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")
    device = token_ids.device
    grid = _grid(token_ids.numel(), block_size, chunk, sink)
    if heuristic == "uniform":
        return _uniform_positions(grid, ratio, device)
    take = {kind: min(_budget(grid.end(kind) - kind * block_size, ratio, chunk), grid.groups(kind))
            for kind in grid.kinds()}
    if max(take.values()) == 0:
        return list(torch.empty((grid.blocks, 0), dtype=torch.int64, device=device).unbind(0))
    scoring = _Scoring(token_ids, grid)
    secondary = _tfidf(scoring) if tie_break == "tfidf" else None
    chosen = _chosen_slots(grid, _SCORERS[heuristic](scoring), secondary, take)
    positions = (_block_firsts(grid, device)[:, None, None] + chosen[:, :, None] * chunk
                 + torch.arange(grid.group_cells, device=device)).view(grid.blocks, -1)
    return _block_rows(positions, _summary_sizes(grid, take, positions))
