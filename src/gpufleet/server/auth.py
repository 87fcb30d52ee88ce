"""Bearer tokens: secrets `gf_…` shown once, stored only as their SHA-256; roles admin, team and metrics."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass

from gpufleet.domain.errors import FieldProblem, SpecError
from gpufleet.ports import Clock
from gpufleet.ports.admin import AdminStore, Role, Token
from gpufleet.server.http_errors import ForbiddenError, NotFoundError, TeamTokenRefusedError, UnauthorizedError
from gpufleet.server.spec import has_control

SECRET_PREFIX = "gf_"
# How long a looked-up token is trusted without asking the store again. Revocations made through this
# process clear the cache at once; the window only matters for a revocation made by another process.
CACHE_TTL_S = 2.0


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_token_id() -> str:
    return "t-" + secrets.token_hex(4)


def create_token(store: AdminStore, clock: Clock, name: str, role: Role, queue: str | None) -> tuple[Token, str]:
    """Create a token and return it with its secret: the only time the secret exists outside the caller."""
    problems = token_problems(name, role, queue)
    if problems:
        raise SpecError("token", tuple(problems))
    if queue and queue not in {q.name for q in store.queues()}:
        raise NotFoundError(f"no queue named {queue!r}", "create it first with `gpufleet quota set QUEUE …`")
    secret = new_secret()
    token = Token(new_token_id(), name.strip(), role, queue or None, hash_secret(secret), clock.now())
    store.create_token(token)
    return token, secret


def token_problems(name: str, role: Role, queue: str | None) -> list[FieldProblem]:
    """What is wrong with a token's name, role and queue together (the queue's existence aside)."""
    problems: list[FieldProblem] = []
    if not name.strip():
        problems.append(FieldProblem("name", "is empty", "name the token after its team or user, e.g. team-a-ci"))
    elif has_control(name):
        problems.append(FieldProblem("name", "contains control characters", "use printable characters only"))
    if role is Role.TEAM and not queue:
        problems.append(FieldProblem("queue", "is missing for a team token", "name the team's queue"))
    if role is not Role.TEAM and queue:
        problems.append(
            FieldProblem("queue", f"is set on a {role.value} token", "drop it: only team tokens belong to a queue")
        )
    return problems


def bootstrap_admin(store: AdminStore, clock: Clock) -> str | None:
    """Create the first admin token if no usable admin token exists; return its secret (print it once)."""
    if any(t.role is Role.ADMIN and not t.revoked for t in store.tokens()):
        return None
    _token, secret = create_token(store, clock, "admin", Role.ADMIN, None)
    return secret


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling (their token) and from where (the client's address). Team principals act on one
    queue; metrics principals may only scrape /metrics."""

    token: Token
    source: str = "local"

    @property
    def admin(self) -> bool:
        return self.token.role is Role.ADMIN

    @property
    def queue(self) -> str | None:
        return None if self.admin else self.token.queue

    def may_see(self, queue: str) -> bool:
        return self.admin or queue == self.token.queue

    def require_admin(self, what: str) -> None:
        if not self.admin:
            raise ForbiddenError(
                f"{what} needs an admin token; this is team token {self.token.name!r} of queue {self.token.queue!r}",
                "ask an administrator",
            )


class Authenticator:
    """Checks bearer secrets against the store, with a short cache so a submit costs one query, not two."""

    def __init__(self, store: AdminStore, refuse_team: str | None = None) -> None:
        """`refuse_team`: why team tokens are refused on this control plane (None: they are accepted)."""
        self._store = store
        self._refuse_team = refuse_team
        self._cache: dict[str, tuple[Token, float]] = {}
        self._lock = threading.Lock()

    def authenticate(self, authorization: str | None, source: str = "local") -> Principal:
        if not authorization:
            raise UnauthorizedError(
                "this endpoint needs a token", "send `Authorization: Bearer gf_…` (CLI: --token or GPUFLEET_TOKEN)"
            )
        scheme, _, secret = authorization.partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise UnauthorizedError(
                "the Authorization header is not `Bearer <token>`", "send `Authorization: Bearer gf_…`"
            )
        return self.authenticate_hash(hash_secret(secret), source)

    def authenticate_hash(self, digest: str, source: str = "local") -> Principal:
        """The principal of the token whose secret hashes to `digest` (a dashboard session keeps the hash, never
        the secret): the same checks as a bearer secret, so a revoked token ends its sessions too."""
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(digest)
        if cached is not None and now - cached[1] < CACHE_TTL_S:
            token: Token | None = cached[0]
        else:
            token = self._store.token_by_hash(digest)
            if token is not None and not token.revoked:
                with self._lock:
                    if len(self._cache) > 10_000:
                        self._cache.clear()
                    self._cache[digest] = (token, now)
        if token is None or token.revoked:
            # One answer for unknown and revoked: the caller learns nothing about which tokens exist.
            raise UnauthorizedError(
                "the token is not valid (unknown or revoked)", "ask an administrator for a new token"
            )
        if self._refuse_team is not None and token.role is Role.TEAM:
            raise TeamTokenRefusedError(
                f"team token {token.name!r} is refused: {self._refuse_team}",
                "run `gpufleet up` as root, so that each queue's jobs run as an OS user of their own, or start "
                "it with --single-user if every team may read every other team's jobs, logs and tokens",
            )
        return Principal(token, source)

    def forget(self) -> None:
        """Drop cached look-ups (after a revocation)."""
        with self._lock:
            self._cache.clear()
