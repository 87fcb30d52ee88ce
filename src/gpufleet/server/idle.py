"""Reserved-but-idle detection and usage accounting over GPU samples, one tick at a time (no I/O, no clock).

A GPU is *idle* while every sample of it since some time `low_since` read a utilisation under the threshold
(default 5 %); it is *flagged* once that run has lasted the window (default 30 min). A job is flagged when
every GPU it holds is flagged: the job is what a policy can notify about or reclaim, and a gang whose other
GPUs work is not idle. A sample without a utilisation reading ends the run ("unknown" is not "idle"), and so
does a change of who holds the GPU (a new job, or the same job restarted): the window restarts with the new
holder.

Fractional GPUs: NVML reports the utilisation of a whole GPU, not of one process, so jobs sharing a GPU are
idle only together. Usage per tick is attributed as follows (`dt` is the time since the previous tick, capped
so that a pause of the sampler is not counted as use or idleness):

- *sampled*: the job's share of each GPU it holds x dt, for GPUs with a reading;
- *used*: the GPU's utilisation x dt, split between the jobs on it in proportion to their shares and capped
  at each job's share (a job never uses more than it holds);
- *reserved-idle*: the job's share x dt while the GPU is flagged, plus, when it becomes flagged, the share x
  the length of the idle run so far (the window that led to the flag was idle too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

GpuKey = tuple[str, int]
DEFAULT_THRESHOLD_PCT = 5.0
DEFAULT_WINDOW_S = 1800.0


@dataclass(frozen=True, slots=True)
class Holder:
    """One job's hold on one GPU. `since` (the attempt's start) tells two runs of the same job apart."""

    job: str
    queue: str
    milli: int = 1000
    since: float = 0.0
    preemptible: bool = True
    stopping: bool = False  # being stopped already (preempted, cancelled): never flagged anew


@dataclass(frozen=True, slots=True)
class IdleFlag:
    """A job found reserved-but-idle: all its GPUs under the threshold since `idle_since`."""

    job: str
    queue: str
    since: float
    idle_since: float
    flagged_at: float
    gpus: tuple[GpuKey, ...]
    gpu_milli: int
    preemptible: bool


@dataclass(slots=True)
class JobUsage:
    """GPU-seconds a job (or queue) held with a reading, used (utilisation-weighted) and held idle."""

    sampled: float = 0.0
    used: float = 0.0
    idle: float = 0.0

    def add(self, other: JobUsage) -> None:
        self.sampled += other.sampled
        self.used += other.used
        self.idle += other.idle

    def as_list(self) -> list[float]:
        return [self.sampled, self.used, self.idle]


@dataclass(frozen=True, slots=True)
class TickResult:
    """What one tick found: jobs newly flagged, usage per job (with its queue) in this tick."""

    flagged: tuple[IdleFlag, ...] = ()
    usage: Mapping[str, tuple[str, JobUsage]] = field(default_factory=dict)


@dataclass(slots=True)
class _GpuState:
    holders: frozenset[tuple[str, float]]
    low_since: float | None = None
    flagged: bool = False


class IdleDetector:
    def __init__(
        self,
        threshold_pct: float = DEFAULT_THRESHOLD_PCT,
        window_s: float = DEFAULT_WINDOW_S,
        *,
        max_gap_s: float = float("inf"),
    ) -> None:
        if not 0 < threshold_pct <= 100:
            raise ValueError(f"idle threshold is {threshold_pct} %; give a percentage in (0, 100]")
        if window_s <= 0:
            raise ValueError(f"idle window is {window_s} s; give a positive number of seconds")
        self.threshold_pct = threshold_pct
        self.window_s = window_s
        self.max_gap_s = max_gap_s
        self._gpus: dict[GpuKey, _GpuState] = {}
        self._flagged: dict[str, IdleFlag] = {}
        self._last: float | None = None

    # --- reading ---------------------------------------------------------------------------------

    def low_since(self, key: GpuKey) -> float | None:
        """Since when the GPU has read under the threshold (None: it is not low now)."""
        state = self._gpus.get(key)
        return None if state is None else state.low_since

    def gpu_flagged(self, key: GpuKey) -> bool:
        state = self._gpus.get(key)
        return state is not None and state.flagged

    def flagged_jobs(self) -> dict[str, IdleFlag]:
        """Jobs flagged now (a job that works again, or stops holding its GPUs, is no longer flagged)."""
        return dict(self._flagged)

    # --- one tick ------------------------------------------------------------------------------------

    def update(
        self, now: float, holders: Mapping[GpuKey, Sequence[Holder]], utils: Mapping[GpuKey, float | None]
    ) -> TickResult:
        """Feed the samples taken at `now` (GPU -> utilisation %, None when unreadable) and who holds each GPU."""
        dt = 0.0 if self._last is None else min(max(0.0, now - self._last), self.max_gap_s)
        self._last = now
        usage: dict[str, tuple[str, JobUsage]] = {}

        def account(holder: Holder) -> JobUsage:
            entry = usage.get(holder.job)
            if entry is None:
                entry = usage[holder.job] = (holder.queue, JobUsage())
            return entry[1]

        for key in [k for k in self._gpus if k not in holders]:
            del self._gpus[key]  # nobody holds it: nothing to watch
        for key, on_gpu in holders.items():
            if not on_gpu:
                self._gpus.pop(key, None)
                continue
            identity = frozenset((h.job, h.since) for h in on_gpu)
            state = self._gpus.get(key)
            if state is None or state.holders != identity:
                state = self._gpus[key] = _GpuState(identity)
            util = utils.get(key)
            was_flagged = state.flagged
            if util is None or util >= self.threshold_pct:
                state.low_since = None
            elif state.low_since is None:
                state.low_since = now
            state.flagged = state.low_since is not None and now - state.low_since >= self.window_s
            total_milli = sum(h.milli for h in on_gpu) or 1
            for holder in on_gpu:
                share = holder.milli / 1000.0
                held = min(dt, max(0.0, now - holder.since))  # not before the job started
                use = account(holder)
                if util is not None:
                    use.sampled += share * held
                    use.used += min(share, util / 100.0 * holder.milli / total_milli) * held
                if state.flagged:
                    assert state.low_since is not None
                    # The whole idle run counts once the GPU is flagged: the window before the flag was idle too.
                    use.idle += share * (held if was_flagged else now - state.low_since)
        return TickResult(self._flag_jobs(now, holders), usage)

    def _flag_jobs(self, now: float, holders: Mapping[GpuKey, Sequence[Holder]]) -> tuple[IdleFlag, ...]:
        gpus_of: dict[str, list[tuple[GpuKey, Holder]]] = {}
        for key, on_gpu in holders.items():
            for holder in on_gpu:
                gpus_of.setdefault(holder.job, []).append((key, holder))
        newly: list[IdleFlag] = []
        still: dict[str, IdleFlag] = {}
        for job, held in sorted(gpus_of.items()):
            states = [self._gpus.get(key) for key, _ in held]
            if not all(s is not None and s.flagged for s in states):
                continue
            first = held[0][1]
            known = self._flagged.get(job)
            if known is not None and known.since == first.since:
                still[job] = known
                continue
            if first.stopping:
                continue
            idle_since = max(s.low_since for s in states if s is not None and s.low_since is not None)
            flag = IdleFlag(
                job=job,
                queue=first.queue,
                since=first.since,
                idle_since=idle_since,
                flagged_at=now,
                gpus=tuple(sorted(key for key, _ in held)),
                gpu_milli=sum(h.milli for _, h in held),
                preemptible=first.preemptible,
            )
            still[job] = flag
            newly.append(flag)
        self._flagged = still
        return tuple(newly)
