"""Tunable constants of the Triton kernels and their launchers, one line each: why the value, and
where it was measured, the results file under ``benchmarks/results/`` that shows it. None changes
a result: every value computes the same scores, bounds and selections (SPEC C). Launchers read them
at call time through this module (``defaults.NAME``), so that a test or a benchmark can change one."""
from compiler.autotune import LaunchConfig, interpreter_active

_INTERPRET = interpreter_active()

# Scoring (scoring/indexer_scores.py)
# The scorer's launch configs, fixed so that every score of a key is bitwise the same (SPEC C.1):
SCORER_CONFIG = LaunchConfig.of(num_warps=4, num_stages=3, BLOCK_T=64)  # bf16/fp16: dense_scorer_groups_h200.json
FP32_SCORER_CONFIG = LaunchConfig.of(num_warps=8, num_stages=3, BLOCK_T=64)  # fp32: dense_scorer_mask_ab_h200.json
FP8_SCORER_CONFIG = LaunchConfig.of(num_warps=4, num_stages=3, BLOCK_T=64)  # E4M3, one promotion per tile: the fastest form under a mask, fp8_promotion_h200.json
REFINE_CONFIG = LaunchConfig.of(num_warps=4, num_stages=3, BLOCK_T=128)  # bf16/fp16 refine on Hopper (scorer_config): 2.64-2.93 ms vs 2.91-3.62 at 64 keys a tile on three trained calls of 65536 keys, bitwise the same codes; 8 warps at 64 keys and any 32-key tile changed codes (H100)
REFINE_COLUMNS = 128  # most product columns (queries x heads) of a refine program that takes REFINE_CONFIG: at 256 its 128-key tile would hold a 128 x 256 fp32 product, 256 registers a thread (lists of 1-2 at 64 heads measured, 4 not)
PRODUCT_COLUMNS = 32 if _INTERPRET else 256  # queries x heads per program: 78-81% of bf16 peak, dense_scorer_groups_h200.json
FP8_PRODUCT_COLUMNS = PRODUCT_COLUMNS  # queries x heads per dense program of the FP8 scorer: the bf16 count; 128 (half the accumulator, three programs an SM) ran 5-32% slower (dense_roofline_fp8_h100)
BOUNDS_BLOCK = 2048  # mask entries per step of the mask-bounds kernel (1024 and 4096 were no faster)
BOUNDS_ROWS = 16 if _INTERPRET else 1  # query rows per mask-bounds program (the interpreter pays per program)

# Screen (screen/)
SCREEN_CONFIGS = (  # screen launch candidates tuned per shape, the first off CUDA: indexer_autotune_h200.md
    LaunchConfig.of(num_warps=8, num_stages=3, BLOCK_T=128),
    LaunchConfig.of(num_warps=4, num_stages=3, BLOCK_T=64),
    LaunchConfig.of(num_warps=8, num_stages=2, BLOCK_T=256),
    LaunchConfig.of(num_warps=8, num_stages=3, BLOCK_T=64),
)  # not offered: BLOCK_T=256 over 4 warps, the slowest in every tuning measured (2.0-2.6x the best), the slowest to compile (9 s at 64 rows); BLOCK_T=128 over 4 warps, 1.65x the best in every tuning measured and spilling at 16 and 32 rows (ptxas, sm_90); 256 matrix rows per program instead of 128 (each key read serving twice the queries), never the fastest on the trained layers (the whole op 1.04-1.08x the best at 64 key rows, 1.3-1.7x at 128; H100, 65536-131072 keys)
SCREEN_SPLIT_LIST_QUERIES = 2  # lists of at least this many queries split key tiles by the mask bounds; single-query lists read the mask on every tile (H100, trained layers: the split form 0.1-0.6 ms slower at lists of 1, 0.5-1.3 ms faster at 4; 2 not measured)
SCREEN_SPLIT_PREFILL_FACTOR = 2  # single-query lists split too when a masked call has at least T / this many queries: at 131072 x 131072 under the causal mask (H100, trained layer 4) certified lists of 1 unsplit took 419 ms against 314 dense, lists of 2 split 299 (split lists of 1 not measured)
SURVIVOR_WORDS = 16 if _INTERPRET else 32  # survivor words per step of a list's compaction (32 keys a word), hardware popc, one scan of word counts: at 32 words over 8 warps 0.45 / 0.28 / 0.14 ms against 0.63 / 0.59 / 0.22 at 64 (H100; 4096 lists of 131072 keys 16% set, 2048 of 131072 at 26%, 2048 of 65536 at 21%); 128 words 0.26-1.01
SURVIVOR_WARPS = 8  # warps per compaction program (at 32 words, 4 warps: 0.40 / 0.54 / 0.16 ms on the lists above)
ACTIVATION_ROWS = 64  # query-head rows per head-activation program
ACTIVATION_KEYS = 64  # witness keys per step of a head-activation program
ACTIVATION_SAMPLES = 256  # witness keys behind each head's activation frequency (it steers choices only)
PLAN_WARPS = 4  # warps per plan program: the plan stage at 4096 queries of 64 heads took 0.65-0.83 ms over 4 against 1.0-1.3 over 8 (H100, r = 15 and 31); over 2 the [H, H] float64 Gram accumulator spills (ptxas, sm_90), and at 128 heads over 4 (1.5 KB; 80-300 B over 8; not timed)
PLAN_STAGES = 3  # pipeline stages of the plan's passes over q's columns; not tuned
PLAN_COLUMNS = 16  # q columns per step of the plan's passes (its float64 tl.dot needs at least 16 on CUDA; 32 took 0-5% longer, H100)
KEY_NORM_BLOCK = 1024 if _INTERPRET else 32  # keys per key-norm program (a [keys, D] float64 tile; the interpreter pays per program); not tuned
SCREEN_OPERANDS_WARPS = 4  # warps per screen-operands program (its queries' RP x D float64 rows); not tuned
SCREEN_OPERANDS_QUERIES = 32 if _INTERPRET else 1  # queries per screen-operands program (the interpreter pays per program)

# Selection (selection/)
LONG_ROW_FACTOR = 8  # rows longer than this many kk take the threshold path; shorter ones torch.topk
FEW_ROWS = 128  # CUDA calls of fewer rows select in one launch (few_rows_select): torch.topk's launches pay below it
CHUNKS_PER_K = 2  # chunks per selected code: 1.4 kk codes pass tau (1: 7.6 kk), selection_parts_sweep_h200.json
THRESHOLD_BUFFER_K = 2  # candidates per row, in kk: holds every row measured, selection_parts_sweep_h200.json
COMPACT_TILE = 4  # codes per lane of a compaction tile, one 16-byte load of words: selection_parts_h200.json
COMPACT_STAGES = 3  # pipeline stages of the compaction loop (1 stage was slower)
COMPACT_SEGMENTS = 4  # single-warp compaction programs per row; 8 overflowed segments of structured rows
MIN_SEGMENT = 256  # fewest slots of a compaction segment
INTERPRETER_TILE = 64  # most codes per lane of a compaction tile under the interpreter, whose cost is per tile
WINDOW_FACTOR = 2  # candidate rows of at most the power of two >= this many kk are selected in registers
KTH_REGISTER_ROW = 16384  # longest row whose kk-th value one program finds in registers
KTH_WARPS = 4  # warps of a program that finds a kk-th value in registers (8 and 16 were slower)
PROGRAM_MAX_WARPS = 32  # most warps one program may have (1024 threads a block)
RADIX_WARPS = 8  # warps of a radix-select program
RADIX_BLOCK = 1024  # codes per step of a radix-select pass
RADIX_PROGRAMS_PER_SM = 2  # radix-select programs per streaming multiprocessor when splits are chosen
SCRATCH_SPLIT_MAX_ROWS = 4  # more rows with scratch: one program each (reads a row ~2 times, splits 17)
FEW_ROWS_BLOCK = 1024  # codes per step of a few-rows program
FEW_ROWS_PROGRAMS_PER_SM = 2  # few-rows programs per streaming multiprocessor over all rows
FEW_ROWS_INTERPRETER_PROGRAMS = 3  # programs off CUDA: several per row, so that the tests run the atomics
FEW_ROWS_WARPS = 8  # warps of a few-rows program

# The certified pipeline (topk_pipeline.py)
CERTIFIED_WINDOW_FACTOR = 4  # a certified row of at most this many kk candidates is selected in registers (at 2, rows of the trained layers at 131072 keys went to the radix selector: 1.9-2.6 ms of a 16-17 ms call on the H100)
CERTIFIED_BUFFER_K = 8  # candidates per certified query, in kk: at most 3.53 kk seen, certified_buffer_h200.json
CERTIFIED_CHUNK_BYTES = 2 << 30  # per-query buffers of one round of a certified call (certified_chunk_rows): a 131072-query prefill call held 17 GiB of candidates in one round on the H100
CERTIFIED_CHUNK_QUERIES = 1024  # a round's queries come in multiples of this (every list size and anchor stride in use divides it)
DEFAULT_R_CAP = 7  # cap of the per-query budget without config.r, so that the screen's row count is static
DENSE_CHUNK_BYTES = 4 << 30  # largest scorer output [rows, T] the dense path allocates at once
PLAN_CHUNK_BYTES = 1 << 30  # queries planned at once, counted as float64 [queries, H, D] (the plan's retained rows [queries, r, D] are at most that): certified_profile_h200.json
REDO_LIVE_TILES = 32  # query tiles per batch row the redo's key splits are sized for (a redone row alone was one program's ~2000 key tiles: 1.9 ms at 131072 keys on the H100; at 8, two empty rounds cost 0.34 ms at 65536); not tuned
REDO_BUFFER_BYTES = 1 << 30  # dense code buffer of one round of the redo ([B, slots, T] int64)
REDO_FEW_ROWS = 32  # flagged rows per batch row the redo selects first by the few-rows path, each over many programs (a round gives a row one program): at 2-8 flagged rows half the rounds' time, at 40 about the same, with none 0.14-0.16 ms more issued alone (redo_cost_h100.md)

# Absorbed sparse attention (attention/absorbed_attention.py, absorbed_attention_ws.py)
ABSORBED_BLOCK_HEADS = 64  # heads of one query per Gluon program, the rows of its warpgroup products (Hopper's wgmma takes 64; the kernel is built for it); the cost model counts the absorbed form's work in blocks of them, and its shape rule takes union below them (compiler.cost_model.shape_form): at 16 heads union wins on trained selections (4.1 vs 4.6 ms), at 128 absorbed wins 2.2x, sparse_attention_configs_h200.md

# Masks (conjunctive_mask.py)
MASK_BLOCK_S = 16  # query rows per conjunctive-mask program
MASK_BLOCK_T = 512  # keys per conjunctive-mask program: 8 KiB of mask written per program

# Row bookkeeping of the certified pipeline (selection/redo_rows.py)
REDO_ROWS_BLOCK = 1024  # rows per step of the row-flag, redo-list, call-count and screen-threshold kernels (bool and int work, a few per call); not tuned
