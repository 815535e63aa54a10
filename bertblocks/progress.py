"""Progress lines for slow steps: one line per stage on stderr, when a person watches.

A step that can take more than a couple of seconds (loading a checkpoint, tracing an export, the first compiled
call after :func:`bertblocks.optimize_for_inference`) says what it is doing, so that a silent terminal is never
mistaken for a hung one. Only a terminal gets these lines: a script, a pipe or a ``--json`` reader (whose stderr
is not a terminal, or who passes ``quiet``) gets nothing extra. The command line's ``progress`` and the library's
slow steps print through this one module, so the rule and the look are the same everywhere.

Example:
    >>> with stage("compiling for inference"):   # on a terminal: "compiling for inference… done in 41.2 s"
    ...     model(**batch)
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator


def shown(quiet: bool = False) -> bool:
    """Whether progress lines are printed now: stderr is a terminal and the caller is not ``quiet``."""
    if quiet:
        return False
    isatty = getattr(sys.stderr, "isatty", None)  # sys.stderr may be None (pythonw) or a stream without it
    return bool(isatty and isatty())


def line(text: str, quiet: bool = False) -> None:
    """Print ``text…`` on stderr (a stage that has begun), when :func:`shown`."""
    if shown(quiet):
        print(f"{text}…", file=sys.stderr, flush=True)


@contextlib.contextmanager
def stage(text: str, quiet: bool = False) -> Iterator[None]:
    """Say ``text…`` when the block starts and ``done in N s`` on the same line when it ends, when :func:`shown`.

    A block that raises ends the line with ``failed after N s`` (the error itself is the caller's to report).
    """
    if not shown(quiet):
        yield
        return
    print(f"{text}… ", end="", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        print(f"failed after {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        raise
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


__all__ = ["line", "shown", "stage"]
