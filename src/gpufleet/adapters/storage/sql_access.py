"""The SQL store's tokens, settings and audit log: who may call the API, the control plane's own key-value
notes, and what admins did."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from gpufleet.adapters.storage import schema as t
from gpufleet.adapters.storage.sql_base import SqlBase
from gpufleet.domain.errors import FieldProblem, SpecError, UnknownNameError
from gpufleet.ports.admin import AuditEntry, Role, Token


class AccessTables(SqlBase):
    """`tokens`, `settings` and `audit`."""

    # --- AdminStore: tokens -------------------------------------------------------------------------------

    def create_token(self, token: Token) -> None:
        """Store a token (its secret's hash only). SpecError for a taken id or hash, or a team token without
        a queue; UnknownNameError for a queue that does not exist."""
        problems = []
        if not token.id:
            problems.append(FieldProblem("id", "is empty", "give the token an id"))
        if not token.secret_hash:
            problems.append(FieldProblem("secret_hash", "is empty", "store the SHA-256 of the secret"))
        if Role(token.role) is Role.TEAM and not token.queue:
            problems.append(FieldProblem("queue", "is not set for a team token", "name the team's queue"))
        if problems:
            raise SpecError(f"token {token.name!r}", tuple(problems))
        with self._tx(write=True) as c:
            if token.queue is not None:
                found = c.execute(
                    sa.select(t.queues.c.name).where(t.queues.c.name == token.queue).with_for_update(read=True)
                ).first()
                if found is None:
                    raise UnknownNameError(f"queue {token.queue!r} does not exist", "create the queue first")
            tk = t.tokens
            clash = c.execute(
                sa.select(tk.c.id, tk.c.secret_hash).where(
                    sa.or_(tk.c.id == token.id, tk.c.secret_hash == token.secret_hash)
                )
            ).all()
            if any(row.id == token.id for row in clash):
                raise SpecError(f"token {token.name!r}", (FieldProblem("id", "is taken", "give a new id"),))
            if clash:
                raise SpecError(
                    f"token {token.name!r}", (FieldProblem("secret", "is already in use", "generate a new secret"),)
                )
            c.execute(sa.insert(tk).values(_token_row(token)))

    def token_by_hash(self, secret_hash: str) -> Token | None:
        """The token with this hash, revoked or not (the caller refuses revoked ones)."""
        with self._tx(write=False) as c:
            row = c.execute(sa.select(t.tokens).where(t.tokens.c.secret_hash == secret_hash)).first()
        return None if row is None else _token(row)

    def tokens(self) -> Sequence[Token]:
        with self._tx(write=False) as c:
            rows = c.execute(sa.select(t.tokens).order_by(t.tokens.c.created_at, t.tokens.c.id)).all()
        return [_token(r) for r in rows]

    def revoke_token(self, token_id: str) -> None:
        """Revoke a token for good (idempotent). UnknownNameError if there is no such token."""
        with self._tx(write=True) as c:
            result = c.execute(sa.update(t.tokens).where(t.tokens.c.id == token_id).values(revoked=True))
            if result.rowcount == 0:
                raise UnknownNameError(f"token {token_id!r} does not exist", "list the tokens to see their ids")

    # --- AdminStore: settings -----------------------------------------------------------------------------

    def get_setting(self, key: str) -> str | None:
        with self._tx(write=False) as c:
            value = c.execute(sa.select(t.settings.c.value).where(t.settings.c.key == key)).scalar()
        return None if value is None else str(value)

    def set_setting(self, key: str, value: str) -> None:
        with self._tx(write=True) as c:
            self._upsert(c, t.settings, {"key": key, "value": value})

    # --- AdminStore: audit log ------------------------------------------------------------------------------

    def audit(self, entry: AuditEntry) -> None:
        with self._tx(write=True) as c:
            c.execute(sa.insert(t.audit).values(dataclasses.asdict(entry)))

    def audit_log(self, since: float | None = None, limit: int = 1000) -> Sequence[AuditEntry]:
        """Audit entries at or after `since`, oldest first; the newest `limit` of them."""
        statement = sa.select(t.audit).order_by(t.audit.c.id.desc()).limit(max(1, limit))
        if since is not None:
            statement = statement.where(t.audit.c.at >= since)
        with self._tx(write=False) as c:
            rows = c.execute(statement).all()
        return [
            AuditEntry(r.at, r.actor, r.action, r.target, r.detail, r.source, r.token_id, r.outcome)
            for r in reversed(rows)
        ]


def _token_row(token: Token) -> dict[str, Any]:
    return {
        "id": token.id,
        "name": token.name,
        "role": Role(token.role).value,
        "queue": token.queue,
        "secret_hash": token.secret_hash,
        "created_at": token.created_at,
        "revoked": token.revoked,
    }


def _token(row: sa.Row[Any]) -> Token:
    return Token(row.id, row.name, Role(row.role), row.queue, row.secret_hash, row.created_at, bool(row.revoked))
