"""Rate limits per token: a token bucket each (a burst, then a steady rate), checked before any work.

One busy team cannot slow the API for the others, and a script stuck in a loop is told to back off
(429 with `Retry-After`) instead of filling the store. Failed authentications are limited per client
address, so guessing tokens cannot load the store either. Limits live in this process's memory: a restart
gives every token a full bucket again."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.domain.errors import GpufleetError
from gpufleet.ports.admin import Role


@dataclass(frozen=True)
class Rate:
    """`per_s` requests a second on average, up to `burst` at once. `per_s == 0`: no limit."""

    per_s: float
    burst: float

    @property
    def unlimited(self) -> bool:
        return self.per_s <= 0


# Defaults: a team's script may submit 500 jobs at once, then 50 a second; admins (and `gpufleet bench api`)
# 10,000 at once, then 1,000 a second, beyond what one control plane serves.
TEAM_RATE = Rate(50.0, 500.0)
ADMIN_RATE = Rate(1000.0, 10_000.0)
FAILED_AUTH_RATE = Rate(10.0, 100.0)  # per client address


class RateLimitedError(GpufleetError):
    """Too many requests (429): retry after `retry_after_s`."""

    def __init__(self, message: str, fix: str, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message, fix)


class TokenBuckets:
    """Token buckets by key. Thread-safe; O(1) a check. Idle full buckets are dropped now and then."""

    def __init__(self, rate: Rate, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000) -> None:
        self.rate = rate
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """Take one request's token; 0.0 if there was one, else the seconds until there is."""
        if self.rate.unlimited:
            return 0.0
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (self.rate.burst, now))
            tokens = min(self.rate.burst, tokens + (now - at) * self.rate.per_s)
            if tokens >= 1.0:
                if len(self._buckets) >= self._max_keys and key not in self._buckets:
                    self._drop_full(now)
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate.per_s

    def _drop_full(self, now: float) -> None:
        refill = self.rate.burst / self.rate.per_s
        self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < refill}


class RateLimits:
    """The API's limits: per token by role, and per client address for failed authentications."""

    def __init__(self, team: Rate = TEAM_RATE, admin: Rate = ADMIN_RATE, failed_auth: Rate = FAILED_AUTH_RATE) -> None:
        self._by_role = {
            Role.ADMIN: TokenBuckets(admin),
            Role.TEAM: TokenBuckets(team),
            Role.METRICS: TokenBuckets(team),
        }
        self._failed = TokenBuckets(failed_auth)

    def check_token(self, token_id: str, name: str, role: Role) -> None:
        buckets = self._by_role[role]
        wait = buckets.take(token_id)
        if wait > 0:
            rate = buckets.rate
            raise RateLimitedError(
                f"token {name!r} sent more than {rate.per_s:g} requests a second (bursts up to {rate.burst:g})",
                f"retry after {wait:.2f} s (the Retry-After header says when); if the rate is too low for your use, "
                f"an admin can raise it (`gpufleet up --{role.value if role is Role.ADMIN else 'team'}-rate …`)",
                wait,
            )

    def check_failed_auth(self, address: str) -> None:
        wait = self._failed.take(address)
        if wait > 0:
            raise RateLimitedError(
                f"too many requests with an invalid token from {address}",
                f"check the token (`gpufleet login URL TOKEN`) and retry after {math.ceil(wait)} s",
                wait,
            )
