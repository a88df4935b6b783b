"""Test-wide settings: Triton kernels run under the CPU interpreter.

TRITON_INTERPRET must be set before any ``@triton.jit`` function is defined, so it is set here,
before the package under test is imported.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402  (after TRITON_INTERPRET)
import torch  # noqa: E402


@pytest.fixture(scope="module")
def one_intra_op_thread():
    """Tiny tensors: one intra-op thread keeps thread start-up from dominating every call."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
