"""What a long-running control loop asks of Python's cyclic garbage collector between steps.

A control plane's heap is mostly long-lived: every waiting and running job, its record, the fleet's tables (at
5,000 nodes with 50,000 jobs waiting, about 1.3 million objects the collector tracks). The loop pauses the
collector for a step (`collector_paused`), but what a step keeps (new records, jobs, holdings) still counts
towards CPython's full collections, which run whenever the objects promoted since the last one reach a quarter of
the long-lived ones: at that size every five steps or so, each a walk over every tracked object (0.7-0.9 s at
5,000 nodes, as often inside a step as between two).

`LongLivedObjects.after_step` collects the young generations (the cyclic garbage a step left), then freezes
everything still alive (`gc.freeze`), so that later collections skip it. A frozen object is still freed by its
reference count when dropped; only reference cycles among frozen objects wait. The loop's own state forms no
cycles (a cycle's state refers to its plugins' view weakly), and every `full_every` steps a full collection of
everything (unfreeze, collect, freeze) reclaims any cycle that did form among them (another part of the process,
an API's request objects, say): what waits is bounded by that many steps. At 5,000 nodes that collection takes
about a second, once in 1,000 steps. (Counting the frozen objects to collect on their growth instead would walk
all of them every step: `gc.get_freeze_count` counts a list.)

The freeze is process-wide, so it is the live control plane's choice (`gpufleet up`, and `bench loop`, which
measures it), not the default of a `Reconciler` embedded elsewhere.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

FULL_EVERY_STEPS = 1_000


@dataclass
class LongLivedObjects:
    """Freezes what survives each step; a full collection of everything every `full_every` steps."""

    full_every: int = FULL_EVERY_STEPS
    full_collections: int = 0
    _steps_to_full: int = field(init=False)

    def __post_init__(self) -> None:
        self._steps_to_full = self.full_every

    def after_step(self) -> None:
        if not gc.isenabled():
            return  # someone paused the collector around the loop: collecting is theirs to decide
        self._steps_to_full -= 1
        if self._steps_to_full <= 0:
            gc.unfreeze()
            gc.collect()
            self.full_collections += 1
            self._steps_to_full = self.full_every
        else:
            gc.collect(1)
        gc.freeze()
