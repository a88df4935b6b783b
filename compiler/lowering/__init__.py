"""Triton kernels and their launchers, grouped by pipeline stage: ``scoring`` (the indexer scorer),
``screen`` (the certificate: its plan and its screen), ``selection`` (exact top-K of order codes),
``attention`` (two-interval and DSA sparse attention); ``topk_pipeline`` runs the indexer's stages
in order. The ops that dispatch to them are in ``compiler/ops/``."""
