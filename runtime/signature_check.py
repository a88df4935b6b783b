"""Argument checks that read no data, remembered per signature.

``checked_on_meta(check, tensors, scalars)`` returns ``check(*tensors, *scalars)`` run on meta
tensors of the tensors' shapes and dtypes (None kept), once per distinct (check, shapes, dtypes,
scalars): a call repeated at one signature, as a decode loop makes it, costs a dictionary lookup.
Errors are never remembered. The caller compares devices and argument types first (a meta run sees
neither)."""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

import torch

__all__ = ["checked_on_meta"]


def checked_on_meta(check: Callable[..., Any], tensors: Sequence[Optional[torch.Tensor]], scalars: tuple = ()) -> Any:
    """``check``'s value on meta stand-ins of ``tensors`` followed by ``scalars`` (module docstring)."""
    return _on_meta(check, tuple(None if t is None else (t.shape, t.dtype) for t in tensors), tuple(scalars))


@functools.lru_cache(maxsize=1024)
def _on_meta(check, signature, scalars):
    meta = [None if s is None else torch.empty(s[0], dtype=s[1], device="meta") for s in signature]
    return check(*meta, *scalars)
