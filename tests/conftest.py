"""Test-wide settings: Triton kernels run under the CPU interpreter; inductor compiles afresh.

TRITON_INTERPRET must be set before any ``@triton.jit`` function is defined, so it is set here,
before the package under test is imported; so are, per worker of a parallel run (the workers share
the cores), one intra-op thread and one inductor compile thread (C++ compiled in the worker
itself: a pool of compile processes, each importing torch, costs more than it overlaps).
Inductor's cache goes to a new directory per run unless TORCHINDUCTOR_CACHE_DIR is set: a shared
cache can hand a run C++ kernels generated for another vector width (AVX-512 loop steps loaded by
an AVX2 run return garbage), so every run tests what this machine compiles.
"""
import os
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="pulsar_dosa_inductor_"))
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import inspect  # noqa: E402

import pytest  # noqa: E402  (after TRITON_INTERPRET)
import torch  # noqa: E402


def _patch_each_language_once_per_launch():
    """Triton 3.6's interpreter patches the language modules a ``@triton.jit`` function sees
    (``triton.language``, ``triton.language.core``: every builtin of the module, its tensor class and
    ``math``) when a kernel launches, and again, identically, at every call of a jit helper inside it
    (``tl.max``, ``tl.cumsum``, the kernels' own helpers), a call of ``inspect.getmembers`` over each
    module every time. Within one launch a module is now patched once: a helper whose modules the
    launch or an earlier helper has patched runs without patching them again. What a kernel computes
    is unchanged: the patches are the same, bound to the same interpreter builder, and the launch
    restores what it patched as before (a helper's patches outlive the launch, as they did). Other
    Triton versions are left as they are."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    if not all(hasattr(interpreter, name) for name in ("_patch_lang", "InterpretedFunction", "InterpreterError")):
        return
    patch_lang, launches = interpreter._patch_lang, []

    def languages(fn):
        return frozenset(id(value) for value in fn.__globals__.values()
                         if inspect.ismodule(value) and value in (tl, tl.core))

    class LaunchScope:
        def __init__(self, scope, patched):
            self.scope = scope
            launches.append(set(patched))

        def restore(self):
            launches.pop()
            self.scope.restore()

    def patch_for_launch(fn):  # the module's name, called by a kernel launch (GridExecutor)
        return LaunchScope(patch_lang(fn), languages(fn))

    def call_helper(self, *args, **kwargs):  # InterpretedFunction.__call__ without the repeated patch
        seen = languages(self.fn)
        if not launches:
            patch_lang(self.fn)
        elif not seen <= launches[-1]:
            patch_lang(self.fn)
            launches[-1] |= seen
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter._patch_lang = patch_for_launch
    interpreter.InterpretedFunction.__call__ = call_helper


if os.environ["TRITON_INTERPRET"] == "1":
    _patch_each_language_once_per_launch()


@pytest.fixture(scope="module")
def one_intra_op_thread():
    """Tiny tensors: one intra-op thread keeps thread start-up from dominating every call."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
