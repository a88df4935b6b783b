"""The DSA indexer scorer on the GPU: dense, key-list and compacted scoring into order codes."""
