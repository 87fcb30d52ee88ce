"""The wall clock: the live control plane's `Clock`."""

from __future__ import annotations

import time


class WallClock:
    def now(self) -> float:
        return time.time()
