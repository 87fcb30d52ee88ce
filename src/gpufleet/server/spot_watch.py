"""The live side of the spot circuit breakers: every `interval_s`, what the store says of the nodes and the
jobs holding them goes into `SpotBreakers.step` (the same code the simulator steps), the gates it returns are
written onto the nodes (`Node.admits`, which bumps the cluster version so the loop schedules with them), and
each breaker's change of state is logged and recorded in the audit log as a `spot.<state>` event by gpufleet.

A spot node's loss is whatever the control plane already does with a lost node (a Ray node leaving, a node
marked unhealthy): this watch only counts it against its pool.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.domain.checkpoints import ObservedPool
from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.spot import BreakerSettings, BreakerState, SpotBreakers
from gpufleet.ports import Clock
from gpufleet.ports.admin import AdminStore, AuditEntry, JobQuery
from gpufleet.server.periodic import Periodic

log = logging.getLogger("gpufleet.spot")

HOLDING = frozenset({JobState.ADMITTED, JobState.LAUNCHING, JobState.RUNNING, JobState.EVICTING})
STATE_CODES = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


@dataclass(frozen=True, slots=True)
class PoolStatus:
    pool: str
    state: str
    since: float
    reason: str
    interruptions_in_window: int
    node_hours_in_window: float
    rate_per_node_hour: float
    interruptions_total: int
    probe: str | None
    description: str


class SpotWatch:
    def __init__(
        self,
        store: AdminStore,
        clock: Clock,
        settings: BreakerSettings | None = None,
        interval_s: float = 5.0,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.breakers = SpotBreakers(settings)
        self.interval_s = interval_s
        self.wake = wake
        self._lock = threading.Lock()
        self._periodic = Periodic("gpufleet-spot", interval_s, self.check, "spot check")

    def awaits_probe(self) -> bool:
        """Whether some pool is half-open with no probe job yet (its nodes admit `probe`)."""
        with self._lock:
            return any(breaker.awaits_probe for breaker in self.breakers.pools.values())

    def check(self) -> list[PoolStatus]:
        now = self.clock.now()
        nodes = self.store.nodes()
        holding = self.store.jobs(JobQuery(states=HOLDING, limit=1_000_000))
        where = {r.id: frozenset(w.node for w in r.workers) for r in holding}
        with self._lock:
            gates, events = self.breakers.step(now, nodes, where)
        changed = False
        for node in nodes:
            gate = gates.get(node.name, "all")
            if node.admits != gate:
                self.store.set_node_flags(node.name, admits=gate)
                changed = True
        for event in events:
            log.warning("spot pool %s %s: %s", event.pool, event.state.value, event.reason)
            detail = f"spot pool {event.pool} {event.state.value}: {event.reason}"
            self.store.audit(AuditEntry(event.at, "gpufleet", f"spot.{event.state.value}", event.pool, detail, "spot"))
        if changed:
            self.wake()
        return self.pools()

    def pools(self) -> list[PoolStatus]:
        now = self.clock.now()
        with self._lock:
            out = []
            for name, breaker in sorted(self.breakers.pools.items()):
                hits, node_hours, rate = breaker.rate(now)
                out.append(
                    PoolStatus(
                        name,
                        breaker.state.value,
                        breaker.since,
                        breaker.reason,
                        hits,
                        node_hours,
                        rate,
                        breaker.interruptions_total,
                        breaker.probe,
                        self.breakers.describe(name, now),
                    )
                )
            return out

    def observed(self) -> dict[str, ObservedPool]:
        """Each pool's measured interruption rate and the node-hours it is over (for checkpoint intervals)."""
        now = self.clock.now()
        with self._lock:
            out = {}
            for name, breaker in self.breakers.pools.items():
                _hits, node_hours, rate = breaker.rate(now)
                out[name] = ObservedPool(rate, node_hours)
            return out

    def start(self) -> None:
        self._periodic.start()

    def stop(self) -> None:
        self._periodic.stop()
