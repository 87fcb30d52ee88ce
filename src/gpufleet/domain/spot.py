"""Spot pools and their circuit breakers: how often a pool's nodes are taken back, and when to stop placing
jobs that cannot survive it.

A **spot pool** is the spot nodes of one zone (`Node.pool == "spot"`, named by `Node.zone`, or `spot` for
nodes without a zone). A spot node that was up and is lost (unhealthy, or gone from the inventory) is an
**interruption** of its pool; the pool's rate is interruptions per node-hour over a sliding window
(`window_s`; node-hours integrated from how many of its nodes were up, at least one node-hour so that a pool
seen for a minute does not read as a storm).

The **breaker** of each pool: `closed` (placements as usual) -> `open` when the rate passes `threshold`
(default 0.3 per node-hour: the 1-node AWS V100 p3.2xlarge preemption rate of the NSDI'24 "Can't Be Late"
traces, 0.23-0.34 per hour across zones; Wu et al., NSDI 2024) -> while open, its nodes admit only jobs that
checkpoint (`blocks="checkpointing"`, default) or none (`blocks="none"`); every interruption restarts the
cool-down -> `half_open` after `cooldown_s`: the next job placed on the pool is the probe (the pool's nodes
admit `probe`: the core places at most one job a cycle there), and the gate closes behind it at the next
step -> `closed` once the probe has run `probe_s` (or ended on its own) with no interruption;
an interruption while half-open opens it again.

`SpotBreakers.step(now, nodes, holdings)` is the whole thing as data in, data out: the live control plane
(`server/spot_watch.py`) and the simulator call it with what they see, and write the gates it returns onto
the nodes (`Node.admits`), which the scheduling core reads. It keeps no clock and draws nothing.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufleet.domain.cluster import Node
from gpufleet.domain.errors import FieldProblem, check

HOUR = 3600.0
# The 1-node V100 spot preemption rate measured in the NSDI'24 "Can't Be Late" traces (0.23-0.34/h by zone).
DEFAULT_THRESHOLD = 0.3


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    threshold: float = DEFAULT_THRESHOLD  # interruptions per node-hour
    window_s: float = HOUR
    cooldown_s: float = 1800.0
    probe_s: float = 1800.0
    blocks: str = "checkpointing"  # what an open pool still admits: "checkpointing" jobs, or "none"

    def __post_init__(self) -> None:
        problems: list[FieldProblem] = []
        if not (math.isfinite(self.threshold) and self.threshold > 0):
            problems.append(FieldProblem("threshold", f"is {self.threshold}", "give interruptions per node-hour > 0"))
        for name in ("window_s", "cooldown_s", "probe_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                problems.append(FieldProblem(name, f"is {value}", "give a duration > 0"))
        if self.blocks not in ("checkpointing", "none"):
            problems.append(FieldProblem("blocks", f"is {self.blocks!r}", "give checkpointing or none"))
        check(problems, "spot breaker settings")


def pool_of(node: Node) -> str | None:
    """The spot pool a node belongs to (its zone), or None for a node that is not spot."""
    if node.pool != "spot":
        return None
    return node.zone or "spot"


@dataclass(frozen=True, slots=True)
class BreakerEvent:
    pool: str
    at: float
    state: BreakerState
    reason: str


@dataclass(slots=True)
class PoolBreaker:
    pool: str
    settings: BreakerSettings = field(default_factory=BreakerSettings)
    state: BreakerState = BreakerState.CLOSED
    since: float = 0.0
    reason: str = ""
    probe: str | None = None
    probe_since: float = 0.0
    interruptions_total: int = 0
    _hits: deque[float] = field(default_factory=deque)
    _samples: deque[tuple[float, int]] = field(default_factory=deque)  # (time, nodes up from then on)

    def rate(self, now: float) -> tuple[int, float, float]:
        """Interruptions in the window, node-hours in it (at least 1), and their ratio."""
        start = now - self.settings.window_s
        hits = sum(1 for t in self._hits if t > start)
        node_s = 0.0
        samples = list(self._samples)
        for (t, up), nxt in zip(samples, [*samples[1:], (now, 0)], strict=True):
            lo, hi = max(t, start), min(nxt[0], now)
            if hi > lo:
                node_s += up * (hi - lo)
        node_hours = max(1.0, node_s / HOUR)
        return hits, node_hours, hits / node_hours

    def _prune(self, now: float) -> None:
        start = now - self.settings.window_s
        while self._hits and self._hits[0] <= start:
            self._hits.popleft()
        while len(self._samples) > 1 and self._samples[1][0] <= start:
            self._samples.popleft()

    def _set(self, state: BreakerState, now: float, reason: str) -> BreakerEvent:
        self.state, self.since, self.reason = state, now, reason
        return BreakerEvent(self.pool, now, state, reason)

    def observe(self, now: float, nodes_up: int, interruptions: int, probe_holding: bool) -> list[BreakerEvent]:
        """What happened since the last call: `interruptions` of this pool's nodes, `nodes_up` now, and whether
        the probe (if any) still holds its resources. Returns the state changes."""
        if not self._samples or self._samples[-1][1] != nodes_up:
            self._samples.append((now, nodes_up))
        for _ in range(interruptions):
            self._hits.append(now)
        self.interruptions_total += interruptions
        self._prune(now)
        s = self.settings
        hits, node_hours, rate = self.rate(now)
        words = (
            f"{hits} interruption{'s' if hits != 1 else ''} in {s.window_s / HOUR:g} h over {node_hours:.1f} "
            f"node-hours = {rate:.2f}/node-h, threshold {s.threshold:g}/node-h"
        )
        events: list[BreakerEvent] = []
        if self.state is BreakerState.CLOSED and interruptions and rate > s.threshold:
            events.append(self._set(BreakerState.OPEN, now, words))
        elif self.state is BreakerState.OPEN:
            if interruptions:
                self.since, self.reason = now, words  # the cool-down starts again
            elif now - self.since >= s.cooldown_s:
                self.probe = None
                events.append(self._set(BreakerState.HALF_OPEN, now, f"cool-down of {s.cooldown_s:g} s over"))
        elif self.state is BreakerState.HALF_OPEN:
            if interruptions:
                self.probe = None
                events.append(self._set(BreakerState.OPEN, now, f"interrupted while probing; {words}"))
            elif self.probe is not None and (not probe_holding or now - self.probe_since >= s.probe_s):
                lived = now - self.probe_since
                self.probe = None
                events.append(self._set(BreakerState.CLOSED, now, f"probe job survived {lived:.0f} s"))
        return events

    def admit_probe(self, job: str, now: float) -> None:
        if self.state is BreakerState.HALF_OPEN and self.probe is None:
            self.probe, self.probe_since = job, now

    @property
    def gate(self) -> str:
        """What the pool's nodes admit now (`Node.admits`): all; probe (one job: the scheduling core places at
        most one job per cycle on a pool so gated, and the next step makes it the probe and shuts the gate);
        or, while open or probing, checkpointing or none."""
        if self.state is BreakerState.CLOSED:
            return "all"
        if self.state is BreakerState.HALF_OPEN and self.probe is None:
            return "probe"
        return self.settings.blocks

    @property
    def awaits_probe(self) -> bool:
        return self.state is BreakerState.HALF_OPEN and self.probe is None


class SpotBreakers:
    """Every spot pool's breaker, fed what the caller sees at each step (see the module doc)."""

    def __init__(self, settings: BreakerSettings | None = None) -> None:
        self.settings = settings or BreakerSettings()
        self.pools: dict[str, PoolBreaker] = {}
        self._up: dict[str, str] = {}  # spot node -> its pool, for the nodes that were up at the last step
        self._placed: set[str] = set()  # jobs holding spot nodes at the last step

    def step(
        self, now: float, nodes: Iterable[Node], holdings: Mapping[str, frozenset[str]]
    ) -> tuple[dict[str, str], list[BreakerEvent]]:
        """`holdings`: the nodes each holding job is on. Returns the gate every spot node should have (its
        `admits`) and the breakers' state changes."""
        nodes = list(nodes)
        up: dict[str, str] = {}
        members: dict[str, list[str]] = {}
        for node in nodes:
            pool = pool_of(node)
            if pool is None:
                continue
            members.setdefault(pool, []).append(node.name)
            if node.healthy:
                up[node.name] = pool
        lost: dict[str, int] = {}
        for name, pool in self._up.items():
            if name not in up:
                lost[pool] = lost.get(pool, 0) + 1
        self._up = up
        on_pool: dict[str, set[str]] = {}
        spot_node_pool = {name: pool for pool, names in members.items() for name in names}
        for job, where in holdings.items():
            for name in where:
                pool = spot_node_pool.get(name)
                if pool is not None:
                    on_pool.setdefault(pool, set()).add(job)
        events: list[BreakerEvent] = []
        for pool in sorted(set(members) | set(lost)):
            breaker = self.pools.get(pool)
            if breaker is None:
                breaker = self.pools[pool] = PoolBreaker(pool, self.settings, since=now)
            jobs = on_pool.get(pool, set())
            if breaker.state is BreakerState.HALF_OPEN and breaker.probe is None:
                new = sorted(jobs - self._placed)
                if new:
                    breaker.admit_probe(new[0], now)
            probe_holding = breaker.probe is not None and breaker.probe in jobs
            nodes_up = sum(1 for name in members.get(pool, ()) if name in up)
            events.extend(breaker.observe(now, nodes_up, lost.get(pool, 0), probe_holding))
        self._placed = {job for jobs in on_pool.values() for job in jobs}
        gates = {name: self.pools[pool].gate for pool, names in members.items() for name in names}
        return gates, events

    def describe(self, pool: str, now: float) -> str:
        """e.g. `spot pool us-east-1a open since 14:02: 5 interruptions in 1 h over 4.0 node-hours = …`."""
        from datetime import UTC, datetime

        breaker = self.pools[pool]
        at = datetime.fromtimestamp(breaker.since, UTC).strftime("%Y-%m-%d %H:%M UTC")
        text = f"spot pool {pool} {breaker.state.value} since {at}"
        if breaker.reason:
            text += f": {breaker.reason}"
        if breaker.probe is not None:
            text += f"; probe job {breaker.probe}"
        return text
