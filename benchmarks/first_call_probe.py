"""Time the first calls of the indexer op at a new odd shape in a fresh process (stacks dumped
while it runs long), as the bad-input report found them stalling: B=2, S=54, H=64, D=128,
T=2694, topk 1991, fp16 integer-valued inputs in -2..2, causal mask; path dense then certified."""
import faulthandler
import json
import sys
import time

import torch

import compiler  # noqa: F401

faulthandler.dump_traceback_later(float(sys.argv[1]) if len(sys.argv) > 1 else 30.0, repeat=True)
g = torch.Generator().manual_seed(0)
B, S, H, D, T, K = 2, 54, 64, 128, 2694, 1991
q = torch.randint(-2, 3, (B, S, H, D), generator=g).half().cuda()
k = torch.randint(-2, 3, (B, T, D), generator=g).half().cuda()
w = torch.randint(-2, 3, (B, S, H), generator=g).half().cuda()
mask = (torch.arange(T)[None, :] <= (T - S + torch.arange(S))[:, None]).expand(B, S, T).cuda()
out = {}
for path in ("dense", "certified", "dense", "certified", "auto"):
    t0 = time.time()
    v, i = torch.ops.pulsar_dosa.certified_topk(q, k, w, K, mask, "", path, 8, None, False)
    torch.cuda.synchronize()
    out.setdefault(path, []).append(round(time.time() - t0, 3))
    print(json.dumps({"path": path, "s": out[path][-1]}), flush=True)
print(json.dumps({"first_call_probe": out}), flush=True)
