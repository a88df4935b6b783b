"""Reference semantics of pulsar-dosa in plain torch (runs on CPU; never imports ``compiler``).

The DSA indexer top-K: ``dense_topk`` (THE SCORER + THE ORDER) and ``certified_topk`` (the
certified exact top-K, bitwise identical to ``dense_topk``).

Docstrings cite formulas as "SPEC A.3": section A.3 of ``docs/SPEC.md``.
"""
