"""Exact top-K of int64 order codes on the GPU: threshold and compaction for long rows, one launch
for a few rows, and the row-gated radix selector."""
