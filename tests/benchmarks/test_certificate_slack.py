import torch

from benchmarks.certificate_slack import KEY_TILE, oracle_tiles


def test_oracle_tiles_counts_a_tile_only_when_every_score_is_below_every_querys_threshold():
    S, T = 4, 3 * KEY_TILE
    s = torch.zeros(S, T)
    visible = torch.ones(S, T, dtype=torch.bool)
    tau = torch.ones(S)
    s[0, KEY_TILE + 5] = 2.0  # one score reaches query 0's threshold in the second key tile
    visible[:, 2 * KEY_TILE:] = False  # the third key tile is hidden from every query
    assert oracle_tiles(s, visible, tau, 1) == 7 / 8  # (query, key tile) pairs: 8 seen, 1 reaches
    assert oracle_tiles(s, visible, tau, 2) == 3 / 4  # the pair of queries 0-1 shares the reaching tile
    assert oracle_tiles(s, visible, tau, 4) == 1 / 2
    tau[:] = 3.0
    assert oracle_tiles(s, visible, tau, 4) == 1.0
