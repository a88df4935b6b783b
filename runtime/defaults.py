"""Tunable constants of the plain-torch references, one line each with its reason. None changes a
result: they steer speed and memory only. Read at call time through this module (``defaults.NAME``),
so that a test can change one."""

# The certified top-K (runtime.certified_topk.CertifiedTopkConfig's defaults; SPEC A.8)
ANCHOR_STRIDE = 16  # one dense anchor query per this many: neighbours share most of their top keys
WITNESSES = True  # anchors' top keys seed their groups: the indexer zoo's families were measured so; on the trained indexers the sample alone sets a threshold nearly as tight (b 0.13-0.18 against 0.09-0.14) for 1.5-3.3 ms less of seeds, so their plans turn witnesses off: certified_trained_h100.md
SINK = 64  # first visible keys added to every seed set
WINDOW = 512  # last visible keys added to every seed set
WORKSPACE_FRAC = 0.25  # survivors a query may refine, as a fraction of T (plus kk); beyond it: dense
SCREEN_ELEMENTS = 1 << 22  # bound on the per-chunk screening intermediates

# The own-threshold sample (runtime.seeds, SPEC C.9)
SAMPLE_PER_KEYS = 128  # one sampled key per this many: 1.6% of 65536 keys, 0.8% of 131072
SAMPLE_MIN = 1024  # fewest sampled keys; no sample below 8 * SAMPLE_MIN keys, where it costs > 1/8 of dense
SAMPLE_MAX = 4096  # most sampled keys
SAMPLE_SIGMAS = 4.0  # the sample rank's safety, in binomial standard deviations (the estimate errs low)

# Chunking of the references (memory bounds)
SCORER_CHUNK_ELEMENTS = 1 << 22  # bound on the scorer's [..., H, keys] float32 intermediate per chunk
ATTENTION_QUERY_CHUNK = 1024  # most queries of a two-interval attention step
ATTENTION_MIN_CHUNK = 64  # a step ends early at a change of segment only once it holds this many queries
ATTENTION_SCORE_BUDGET = 1 << 26  # most fp32 scores (heads x queries x keys) of one attention step

# The FP8 indexer key cache (runtime.fp8_key_cache)
FP8_CACHE_MIN_KEYS = 16  # smallest storage of a cache, in keys; it grows by doubling, so appends cost O(1) amortised
