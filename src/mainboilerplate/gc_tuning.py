"""The garbage collector's settings for member processes (brokers and consumers).

A member allocates several objects per message or append that die young, by reference
counting. CPython's collector still runs a young-generation pass every 700 net allocations,
and promotes what a pass finds alive (a batch of messages in flight) to older generations,
whose passes trace every object the process ever imported: ~50 ms each in a consumer. Those
passes took about a third of a consumer's CPU in the keyed-count benchmark. So once the
process has imported its code, `tune` moves every object that exists then out of the
collector's view (`gc.freeze`: they live as long as the process anyway) and makes young
passes rarer (threshold 20,000: at most a few MB of cyclic garbage waits for a pass).

``GAZETTE_GC=default`` keeps Python's settings (for a memory-tight host, or to compare).
Disabling the collector was rejected: cycles (exceptions with tracebacks, asyncio's
callbacks) would then never be freed.
"""

from __future__ import annotations

import gc
import os

__all__ = ["YOUNG_THRESHOLD", "tune"]

YOUNG_THRESHOLD = 20_000
"""Net allocations between young-generation passes (Python's default: 700)."""


def tune() -> bool:
    """Freeze what exists and raise the young threshold, unless ``GAZETTE_GC=default``;
    whether the settings changed."""
    if os.environ.get("GAZETTE_GC", "") == "default":
        return False
    gc.collect()  # What is garbage now is not frozen with the rest.
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    return True
