"""Attention kernels: two-interval attention for Pulsar layouts, DSA sparse attention."""
