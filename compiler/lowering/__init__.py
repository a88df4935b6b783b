"""Triton kernels and their launchers, one file per kernel family (the ops that dispatch to them
are in ``compiler/ops/``)."""
