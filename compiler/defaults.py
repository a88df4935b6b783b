"""Tunable constants of the backend's decisions, one line each: why the value, and where it was
measured, the results file under ``benchmarks/results/`` that shows it. Read at call time through
this module (``defaults.NAME``), so that a test or a benchmark can change one for a run."""

# An indexer layer without a plan (compile and call time, compiler.cost_model.default_min_keys)
DEFAULT_SURVIVAL = 0.03  # survival assumed for a trained indexer: the DoSA write-up's 2.65% (SPEC A.7)
ASSUMED_R = 4  # budget assumed: the runtime's rule (|H+| rounded up to 4) for trained indexers (SPEC A.8)

# Plan time (compiler.plan.choice)
PAYS_BELOW = 0.9  # certify a layer only when predicted below this fraction of the dense time
MIN_SCREENED_KEYS = 1 << 22  # evidence: survival measured over at least this many screened (query, key) pairs
MIN_CERTIFIED_QUERIES = 64  # evidence: ... of at least this many certified queries
SHORT_CANDIDATE_ROWS = 32  # default plan budgets: r with r + 1 a power of two, at most this many screen rows and half the heads: certified_trained_h100.md (the trained indexers' best budgets are 15 and 31)

# Compile time (compiler.policy): calls of fewer B*S*T*H products keep the stock subgraph, per pass
# family and device type, where the op's per-call host cost exceeds the stock form's device time;
# a device type not listed keeps every call stock (the ops run plain-torch references there).
# e2e_decode_h200.md (indexer), sparse_attention_h200.md (decode rows at B = 1: 0.39-0.65 ms per call).
STOCK_BELOW = {"dsa_indexer": {"cuda": 1 << 25}, "sparse_attention": {"cuda": 1 << 21}}

# Compile time (compiler.policy.sparse_attention_form): the form of an MLA layer's DSA sparse attention
# (where a call cannot measure its selections, compiler.cost_model.shape_form decides on its heads)
UNION_MIN_QUERIES = 16  # fewer queries per batch row (decode): no neighbours share keys, and the absorbed form reads the latent cache unexpanded

# Call time (compiler.ops.sparse_form): the form of an "auto" absorbed sparse attention call
FREE_FRACTION = 0.9  # share of the device's free memory the union form's expanded keys and values and its workspace may take; past it the call takes absorbed

# Call time (compiler.ops.guard)
MIN_CERTIFIED_ROWS = 32  # fewer queries per batch row are scored densely: too few neighbours to share anchors
RETRY_FIRST = 8  # dense calls before a losing certified path is retried ...
RETRY_MAX = 512  # ... doubling the wait after every lost retry, up to this
SURE_LOSS_SURVIVAL = 0.9  # a certified call that refined more of its screened pairs did the dense work and more
SURE_LOSS_REDO = 0.5  # ... or that redid more of its queries densely
GUARD_LADDER = ((15, 2, False), (31, 2, False))  # (r, list_queries, witnesses) a layer left to the defaults tries in turn after its certified calls lose: the trained indexers' best settings at 65536-131072 keys, where the runtime's r <= 7 prunes nothing (certified_trained_h100.md)
