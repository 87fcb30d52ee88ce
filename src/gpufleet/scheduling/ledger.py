"""Quota accounting for one cycle: what each queue uses, and whether a request fits its quota.

Semantics (see `gpufleet.domain.quotas`): a queue may use up to nominal + borrowing_limit; what it
uses above its guaranteed part draws on its cohort's pool of lendable quota, which must not be
overdrawn. A queue without a cohort is its own pool.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufleet.domain.quotas import CPU, GPU, GPU_MODEL_PREFIX, MEMORY, QueueSpec, Quota, gpu_model_key
from gpufleet.domain.resources import MILLI_PER_GPU

Usage = Mapping[str, int]
_MISSING = object()


def format_amount(key: str, amount: int | float) -> str:
    if key == GPU or key.startswith(GPU_MODEL_PREFIX):
        return f"{amount / MILLI_PER_GPU:g}"
    if key == CPU:
        return f"{amount / 1000:g}"
    return f"{amount / 1024**3:g} GiB"


def resource_label(key: str) -> str:
    if key == GPU:
        return "GPU"
    if key.startswith(GPU_MODEL_PREFIX):
        return key[len(GPU_MODEL_PREFIX) :]
    return key.upper() if key == CPU else key


@dataclass(frozen=True, slots=True)
class QuotaVerdict:
    fits: bool
    reason: str = ""
    ever: bool = True  # False: the request exceeds what the queue could ever get


FITS = QuotaVerdict(True)


class QuotaLedger:
    def __init__(self, queues: Iterable[QueueSpec]) -> None:
        self.queues: dict[str, QueueSpec] = {q.name: q for q in queues}
        self.usage: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.members: dict[str, tuple[str, ...]] = {}
        cohorts: dict[str, list[str]] = defaultdict(list)
        for q in sorted(self.queues.values(), key=lambda q: q.name):
            if q.cohort is not None:
                cohorts[q.cohort].append(q.name)
        self.members = {c: tuple(names) for c, names in cohorts.items()}
        # A cohort's pool for a resource: the sum of its members' lendable quota; and its usage.
        self.pool_used: dict[tuple[str, str], int] = defaultdict(int)
        self._pool_capacity: dict[tuple[str, str], int] = {}  # queues are fixed for the cycle
        self._quota: dict[tuple[str, str], Quota | None] = {}
        # Queues with a quota per GPU model (their admission narrows the models a job may use).
        self.per_model: frozenset[str] = frozenset(
            q.name for q in self.queues.values() if any(k.startswith(GPU_MODEL_PREFIX) for k in q.quotas)
        )
        self.version: dict[str, int] = defaultdict(int)  # bumped on every change of a queue's usage
        # The part of `usage` that is quota held for preemptors, not jobs that hold resources.
        self.reserved: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def copy(self) -> QuotaLedger:
        """An independent copy of the usage; the queue definitions and their caches are shared."""
        other = copy.copy(self)
        other.usage = defaultdict(lambda: defaultdict(int))
        for queue, row in self.usage.items():
            other.usage[queue] = defaultdict(int, row)
        other.pool_used = defaultdict(int, self.pool_used)
        other.version = defaultdict(int, self.version)
        other.reserved = defaultdict(lambda: defaultdict(int))
        for queue, row in self.reserved.items():
            other.reserved[queue] = defaultdict(int, row)
        return other

    def counters(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """Every queue's usage and every cohort pool's use, as flat copies (see `raise_to`)."""
        rows = {(queue, key): amount for queue, row in self.usage.items() for key, amount in row.items()}
        return rows, dict(self.pool_used)

    def raise_to(self, rows: Mapping[tuple[str, str], int], pools: Mapping[tuple[str, str], int], holder: str) -> None:
        """Raise every counter below the given one to it; what a queue's row gains is held for `holder`'s
        preemptor (`reserved`: it does not make the queue borrow).

        A preemptor must count once: on the ledger as it is (its victims still hold their quota) and on
        the ledger once they stopped and it runs. Taking the larger of the two per counter holds its
        quota without counting the quota its victims give back twice, which would make the next
        preemptor of the cohort stop jobs for quota that is already on its way back."""
        for (queue, key), amount in sorted(rows.items()):
            row = self.usage[queue]
            gain = amount - row[key]
            if gain > 0:
                row[key] = amount
                self.version[queue] += 1
                if queue == holder:
                    self.reserved[queue][key] += gain
        for pool, amount in pools.items():
            self.pool_used[pool] = max(self.pool_used[pool], amount)

    def quota(self, queue: str, key: str) -> Quota | None:
        cached = self._quota.get((queue, key), _MISSING)
        if cached is not _MISSING:
            return cached  # type: ignore[return-value]
        spec = self.queues.get(queue)
        quota = None if spec is None else spec.quotas.get(key)
        if spec is not None and quota is None and key.startswith(GPU_MODEL_PREFIX) and spec.model_quotas:
            quota = Quota(nominal=0, borrowing_limit=0)  # per-model quotas list what the queue may use
        if spec is not None and spec.deprioritised and quota is not None and quota.nominal is not None:
            quota = Quota(quota.nominal, 0, quota.lending_limit)  # a spent budget: no borrowing
        self._quota[(queue, key)] = quota
        return quota

    def pool_capacity(self, cohort: str, key: str) -> int:
        cached = self._pool_capacity.get((cohort, key))
        if cached is not None:
            return cached
        total = 0
        for member in self.members.get(cohort, ()):
            quota = self.quota(member, key)
            if quota is not None:
                total += quota.lendable
        self._pool_capacity[(cohort, key)] = total
        return total

    def _over_guaranteed(self, queue: str, key: str, used: int) -> int:
        quota = self.quota(queue, key)
        if quota is None or quota.nominal is None:
            return 0  # an unlimited quota does not draw on the cohort's pool
        return max(0, used - quota.guaranteed)

    def add(self, queue: str, usage: Usage, sign: int = 1) -> None:
        self.version[queue] += 1
        spec = self.queues.get(queue)
        cohort = spec.cohort if spec is not None else None
        row = self.usage[queue]
        for key, amount in usage.items():
            before = row[key]
            after = before + sign * amount
            row[key] = after
            if cohort is not None:
                quota = self.quota(queue, key)
                if quota is None or quota.nominal is None:
                    continue  # an unlimited quota does not draw on the cohort's pool
                guaranteed = quota.guaranteed
                self.pool_used[(cohort, key)] += max(0, after - guaranteed) - max(0, before - guaranteed)

    def used(self, queue: str, key: str) -> int:
        return self.usage[queue][key] if queue in self.usage else 0

    def fits(self, queue: str, key: str, amount: int) -> QuotaVerdict:
        quota = self.quota(queue, key)
        if quota is None or quota.nominal is None or amount == 0:
            return FITS
        label = resource_label(key)
        row = self.usage.get(queue)
        used = row[key] if row is not None else 0
        spec = self.queues[queue]
        borrow = quota.borrowing_limit
        if spec.cohort is None:
            borrow = 0
        limit = None if borrow is None else quota.nominal + borrow
        if spec.cohort is not None and borrow is None:
            limit = quota.guaranteed + self.pool_capacity(spec.cohort, key)
        if limit is not None and amount > limit:
            return QuotaVerdict(
                False,
                f"queue {queue} asks for {format_amount(key, amount)} {label} but its {label} quota allows "
                f"at most {format_amount(key, limit)}",
                ever=False,
            )
        if limit is not None and used + amount > limit:
            allowance = (
                f"nominal {format_amount(key, quota.nominal)}"
                if limit == quota.nominal
                else f"nominal {format_amount(key, quota.nominal)} + borrowing = {format_amount(key, limit)}"
            )
            return QuotaVerdict(
                False,
                f"queue {queue} at its {label} quota ({format_amount(key, used)}/{format_amount(key, limit)}: "
                f"asks {format_amount(key, amount)} more, may use {allowance})"
                + ("; its budget is spent, so it does not borrow" if spec.deprioritised else ""),
            )
        if spec.cohort is None:
            return FITS
        over_after = self._over_guaranteed(queue, key, used + amount)
        over_before = self._over_guaranteed(queue, key, used)
        pool_used = self.pool_used[(spec.cohort, key)]
        capacity = self.pool_capacity(spec.cohort, key)
        if pool_used + over_after - over_before > capacity:
            return QuotaVerdict(
                False,
                f"cohort {spec.cohort} has no idle {label} quota "
                f"({format_amount(key, pool_used)}/{format_amount(key, capacity)} in use; "
                f"queue {queue} uses {format_amount(key, used)} of its nominal {format_amount(key, quota.nominal)})",
            )
        return FITS

    def within_nominal(self, queue: str, usage: Usage) -> bool:
        """Whether the queue stays within its nominal quota after adding `usage` (reclaim may help)."""
        for key, amount in usage.items():
            quota = self.quota(queue, key)
            if quota is not None and quota.nominal is not None and self.used(queue, key) + amount > quota.nominal:
                return False
        return True

    def over_nominal(self, queue: str, keys: Iterable[str] | None = None) -> bool:
        """Whether the queue borrows now: uses more than its nominal quota of some resource (of
        `keys` only, if given: reclaim takes back only what the preemptor needs, as Kueue does).

        Quota reserved for its preemptors does not count: the victims it waits for may be its own
        jobs, whose quota comes back when they stop, so a reservation alone never makes it borrow."""
        reserved = self.reserved.get(queue, {})
        wanted = None if keys is None else set(keys)
        for key, used in self.usage.get(queue, {}).items():
            if wanted is not None and key not in wanted and not (GPU in wanted and key.startswith(GPU_MODEL_PREFIX)):
                continue
            quota = self.quota(queue, key)
            if quota is not None and quota.nominal is not None and used - reserved.get(key, 0) > quota.nominal:
                return True
        return False

    def protected(self, queue: str) -> bool:
        """A queue within a finite nominal quota is protected from preemption by other queues."""
        spec = self.queues.get(queue)
        if spec is None or not spec.quotas:
            return False
        if not any(q.nominal is not None for q in spec.quotas.values()):
            return False
        return not self.over_nominal(queue)


def job_usage(gpu_milli: int, cpu_milli: int, memory: int, models: Mapping[str, int]) -> dict[str, int]:
    """Quota usage of a placement: total milli-GPU, per model, CPU and memory (zero entries omitted)."""
    usage: dict[str, int] = {}
    if gpu_milli:
        usage[GPU] = gpu_milli
    for model, milli in models.items():
        if milli:
            usage[gpu_model_key(model)] = usage.get(gpu_model_key(model), 0) + milli
    if cpu_milli:
        usage[CPU] = cpu_milli
    if memory:
        usage[MEMORY] = memory
    return usage
