"""``selection_overlap.union_ratio``: the sampled tiles' mean union, against sets built in Python."""
import pytest
import torch

from compiler.lowering.attention import selection_overlap
from compiler.lowering.attention.selection_overlap import sampled_tiles, union_ratio


def python_ratio(indices, mask, seq_k, tile, tiles):
    """Mean over the flat tile ids ``tiles`` of |visible distinct keys| / K, from Python sets."""
    b, s, width = indices.shape
    per_row = -(-s // tile)
    sizes = []
    for flat in tiles.tolist():
        batch, first = divmod(flat, per_row)
        keys = set()
        for row in range(first * tile, min(first * tile + tile, s)):
            for key in indices[batch, row].tolist():
                if 0 <= key < seq_k and (mask is None or bool(mask.expand(b, 1, s, seq_k)[batch, 0, row, key])):
                    keys.add(key)
        sizes.append(len(keys))
    return sum(sizes) / len(sizes) / width


@pytest.mark.parametrize("b,s,t,width,tile,masked", [(3, 70, 50, 6, 16, True), (1, 40, 9, 4, 32, False),
                                                      (2, 130, 300, 32, 64, True)])
def test_every_tile_measured_when_few_repeats_and_hidden_keys_excluded(b, s, t, width, tile, masked):
    g = torch.Generator().manual_seed(s)
    indices = torch.randint(-3, t + 3, (b, s, width), generator=g)
    indices[:, 1::3] = indices[:, ::3][:, :indices[:, 1::3].shape[1]]  # repeats across rows of a tile
    indices[:, :, -1] = indices[:, :, 0]  # and within a row
    mask = (torch.rand(b, 1, s, t, generator=g) < 0.6) if masked else None
    tiles = sampled_tiles(b, -(-s // tile), indices.device)
    assert tiles.tolist() == list(range(b * -(-s // tile)))  # fewer than SAMPLED_TILES: all of them
    got = union_ratio(indices.to(torch.int32), mask, t, tile)
    assert got.dtype == torch.float32 and got.dim() == 0
    assert got.item() == pytest.approx(python_ratio(indices, mask, t, tile, tiles), rel=1e-6)


def test_many_tiles_are_sampled_evenly_and_measured_exactly(monkeypatch):
    monkeypatch.setattr(selection_overlap, "SAMPLED_TILES", 5)
    g = torch.Generator().manual_seed(1)
    indices = torch.randint(0, 500, (2, 200, 8), generator=g)
    tiles = sampled_tiles(2, 13, indices.device)  # 2 x ceil(200/16) = 26 tiles
    assert tiles.tolist() == [0, 5, 10, 15, 20]
    mask = torch.ones(1, 1, 1, 500, dtype=torch.bool)  # broadcast over batch and rows
    got = union_ratio(indices, mask, 500, 16).item()
    assert got == pytest.approx(python_ratio(indices, None, 500, 16, tiles), rel=1e-6)


@pytest.mark.parametrize("fill", ["out_of_range", "hidden", "empty"])
def test_no_visible_key_gives_zero(fill):
    indices = torch.full((1, 20, 0 if fill == "empty" else 4), -1 if fill == "out_of_range" else 3)
    mask = torch.zeros(1, 1, 20, 10, dtype=torch.bool) if fill == "hidden" else None
    assert union_ratio(indices, mask, 10, 16).item() == 0.0


def test_identical_rows_give_one_and_disjoint_rows_the_tile():
    shared = torch.arange(8).expand(1, 32, 8)
    disjoint = torch.arange(32 * 8).view(1, 32, 8)
    assert union_ratio(shared, None, 256, 32).item() == 1.0
    assert union_ratio(disjoint, None, 256, 32).item() == 32.0
