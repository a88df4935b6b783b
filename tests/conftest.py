"""Test-wide settings: Triton kernels run under the CPU interpreter; inductor compiles afresh.

TRITON_INTERPRET must be set before any ``@triton.jit`` function is defined, so it is set here,
before the package under test is imported; so is one intra-op thread per worker of a parallel run
(the workers share the cores). Inductor's cache goes to a new directory per run unless
TORCHINDUCTOR_CACHE_DIR is set: a shared cache can hand a run C++ kernels generated for another
vector width (AVX-512 loop steps loaded by an AVX2 run return garbage), so every run tests what
this machine compiles.
"""
import os
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="pulsar_dosa_inductor_"))
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402  (after TRITON_INTERPRET)
import torch  # noqa: E402


@pytest.fixture(scope="module")
def one_intra_op_thread():
    """Tiny tensors: one intra-op thread keeps thread start-up from dominating every call."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
