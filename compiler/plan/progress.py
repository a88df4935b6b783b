"""A progress bar for the plan CLI: tqdm when installed, else one rewritten line on stderr."""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator


@contextlib.contextmanager
def progress(total: int, desc: str) -> Iterator[Callable[[], None]]:
    """Yield ``step()``, which advances the bar by one of ``total`` units."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        with tqdm(total=total, desc=desc, file=sys.stderr, leave=True) as bar:
            yield lambda: bar.update(1)
        return
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        sys.stderr.write(f"\r{desc}: {done}/{total}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    yield step
