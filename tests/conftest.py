"""Test-wide settings: Triton kernels run under the CPU interpreter.

TRITON_INTERPRET must be set before any ``@triton.jit`` function is defined, so it is set here,
before the package under test is imported.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
