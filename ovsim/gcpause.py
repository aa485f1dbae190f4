"""Pausing Python's cyclic garbage collector around allocation-heavy work that makes no cycles.

Parsing a large trace creates millions of dicts, lists and tuples that stay alive until the table
is built. Each time enough of them have been allocated, CPython's collector scans every tracked
object, and its full collections rescan the whole growing heap: on a 100 MB Kineto trace that took
more time than the parsing itself. JSON values and the importers' row tuples hold no reference
cycles, so reference counting frees all of them; pausing the collector loses nothing, and the
collector runs as before once the work is done.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside the block, restoring its previous state after it (also on
    an exception); nests."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
