"""The running USD counter behind `gpufleet_cost_usd_total{queue,model,pool}`: at each telemetry tick, what
every holding job holds (per GPU model and pool) x the time since the last tick x its price.

The price table is re-read from the store every `refresh_s`; a model and pool without a price add nothing
(the cost report counts their GPU-hours as unpriced). This counter is since the control plane started, as
Prometheus counters are; the exact bill, per attempt at the price it started under, is `report cost`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from gpufleet.domain.cluster import Node
from gpufleet.domain.costs import HOUR, PriceTable, charges_for
from gpufleet.ports.admin import AdminStore
from gpufleet.scheduling.plugin_api import Holding

MAX_STEP_S = 300.0  # a tick that comes after a longer gap (a stopped clock, a suspended host) counts this much


class CostMeter:
    def __init__(self, store: AdminStore, refresh_s: float = 60.0) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._usd: dict[tuple[str, str, str], float] = {}
        self._prices = PriceTable()
        self._prices_at: float | None = None
        self._last: float | None = None

    def add(self, at: float, holdings: Iterable[Holding], nodes: Mapping[str, Node]) -> None:
        if self._prices_at is None or at - self._prices_at >= self.refresh_s:
            self._prices = self.store.prices()
            self._prices_at = at
        last, self._last = self._last, at
        if last is None or at <= last:
            return
        hours = min(at - last, MAX_STEP_S) / HOUR
        with self._lock:
            for holding in holdings:
                for charge in charges_for(holding.workers, nodes, self._prices):
                    if charge.usd_per_gpu_hour is None:
                        continue
                    key = (holding.job.queue, charge.model, charge.pool.value)
                    self._usd[key] = self._usd.get(key, 0.0) + charge.gpus * hours * charge.usd_per_gpu_hour

    def totals(self) -> dict[tuple[str, str, str], float]:
        with self._lock:
            return dict(self._usd)
