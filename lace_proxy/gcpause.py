"""Python's cyclic garbage collector paused while the proxy builds state at scale.

A list of 30k services, and a full sync at that size, allocate millions of containers (the
decoded JSON, the model objects, rendered and read-back elements) that make no cycles and
either live on or are freed by reference counting. Allocating them set off the collector's
passes, each over the whole long-lived heap, which found nothing to free: a third of decoding
a 30k list, 0.3-0.4 s of a 30k adoption, most of rendering IPVS mode's 10k virtual services.
What cycles a paused stretch leaves are collected after it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_holders = 0  # pauses under way, in any thread or task
_resume = False  # whether the collector was on when the first of them began


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """The collector off until every overlapping pause has ended (the reflectors' lists
    interleave on the event loop, a full sync runs in a worker thread); a collector its
    caller had turned off stays off."""
    global _holders, _resume
    with _lock:
        if _holders == 0:
            _resume = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _resume:
                gc.enable()
