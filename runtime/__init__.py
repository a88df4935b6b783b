"""Reference semantics of pulsar-dosa in plain torch (runs on CPU; never imports ``compiler``).

The DSA indexer top-K: ``dense_topk`` (THE SCORER + THE ORDER) and ``certified_topk`` (the
certified exact top-K, bitwise identical to ``dense_topk``).
"""
