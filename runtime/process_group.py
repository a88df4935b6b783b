"""The process group of a distributed call, checked before its first collective."""
from __future__ import annotations

import torch.distributed as dist

__all__ = ["checked_world_size"]


def checked_world_size(group: object) -> int:
    """The number of ranks of ``group`` (None: the default group); TypeError/ValueError naming
    ``group`` when it is not a process group, torch.distributed is not initialised, or this process
    is not a member."""
    if not dist.is_available():
        raise ValueError("group: torch.distributed is not available in this build of torch")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group: expected a torch.distributed ProcessGroup or None (the default group), "
                        f"got {type(group).__name__}")
    if not dist.is_initialized():
        raise ValueError("group: expected an initialised torch.distributed process group "
                         "(torch.distributed is not initialised)")
    if dist.get_rank(group) < 0:
        raise ValueError("group: this process is not a member of the group")
    return dist.get_world_size(group)
