"""``import compiler`` and the CPU references run where triton is not installed (it is declared for
Linux only): a fresh interpreter in which ``import triton`` fails as it does without the package."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import importlib.abc, sys

class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTriton())
import torch
import compiler
from runtime.dense_scorer import dense_topk

g = torch.Generator().manual_seed(0)
q, k, w = torch.randn(1, 3, 4, 8, generator=g), torch.randn(1, 16, 8, generator=g), torch.randn(1, 3, 4, generator=g)
values, indices = compiler.certified_topk(q, k, w, 5)
assert torch.equal(indices, dense_topk(q, k, w, 5)[1])
qa, ka = torch.randn(1, 2, 3, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g)
out = torch.ops.pulsar_dosa.attention(qa, ka, ka, None, True, None, False, "sdpa")
assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(qa, ka, ka, is_causal=True))
sparse = torch.ops.pulsar_dosa.sparse_attention(qa, ka, ka, torch.tensor([[[0, 1], [2, 3], [4, 4]]]), None, 0.3, "zero")
assert sparse.shape == (1, 2, 3, 8)
assert not any(name == "triton" or name.startswith("triton.") for name in sys.modules)
print("ok")
"""


def test_import_compiler_and_run_cpu_references_without_triton():
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
