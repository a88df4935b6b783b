"""Per-layer top-K statistics, keyed by the op's ``layer`` argument (a module path).

The op adds into a layer's :class:`runtime.certified_topk.TopkStats` (device tensors and host
ints, no host sync). Only :meth:`TopkStatsRegistry.summaries` synchronises, when someone asks.
"""
from __future__ import annotations

import torch

from runtime.certified_topk import TopkStats


class TopkStatsRegistry:
    """layer -> TopkStats, one per (layer, device)."""

    def __init__(self) -> None:
        self._stats: dict[tuple[str, torch.device], TopkStats] = {}

    def for_layer(self, layer: str, device: torch.device) -> TopkStats:
        """The accumulator of ``layer`` on ``device`` (created empty on first use)."""
        key = (layer, torch.device(device))
        if key not in self._stats:
            self._stats[key] = TopkStats()
        return self._stats[key]

    def summaries(self) -> dict[str, dict]:
        """layer -> ``TopkStats.summary()`` (host sync); a layer seen on several devices appears once per device."""
        out = {}
        for (layer, device), stats in sorted(self._stats.items(), key=lambda item: (item[0][0], str(item[0][1]))):
            name = layer if sum(1 for l, _ in self._stats if l == layer) == 1 else f"{layer}@{device}"
            out[name] = stats.summary()
        return out

    def reset(self) -> None:
        """Forget every accumulator."""
        self._stats.clear()


TOPK_STATS = TopkStatsRegistry()
