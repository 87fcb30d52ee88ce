"""The audit log of admin actions: who (the token's name), what, when, from where, and whether it was done
or denied. Entries go to the store, next to what they describe; `GET /v1/audit` and `gpufleet audit` read
them back (admin only)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from gpufleet.ports import Clock
from gpufleet.ports.admin import AdminStore, AuditEntry
from gpufleet.server.auth import Principal

DENIED = "denied"


class Auditor:
    def __init__(self, store: AdminStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def record(
        self,
        principal: Principal,
        action: str,
        target: str,
        detail: Mapping[str, object] | None = None,
        outcome: str = "ok",
    ) -> None:
        """Add an entry for what `principal` did (`action` on `target`, e.g. `queue.set` on `team-a`)."""
        text = json.dumps(dict(detail), sort_keys=True, default=str) if detail else ""
        token = principal.token
        self.store.audit(
            AuditEntry(self.clock.now(), token.name, action, target, text, principal.source, token.id, outcome)
        )

    def require_admin(self, principal: Principal, what: str, action: str, target: str) -> None:
        """ForbiddenError for a non-admin token; the attempt is logged as denied first."""
        if not principal.admin:
            self.record(principal, action, target, outcome=DENIED)
        principal.require_admin(what)
