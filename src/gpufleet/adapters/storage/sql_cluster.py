"""The SQL store's queues and nodes: the cluster the loop schedules on. Every change that alters it bumps
the cluster version, which the loop watches to rebuild its state."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from gpufleet.adapters.storage import schema as t
from gpufleet.adapters.storage.codec import (
    decode_node,
    decode_queue,
    decode_window,
    encode_node,
    encode_queue,
    encode_window,
)
from gpufleet.adapters.storage.sql_base import ACTIVE_STATES, CHUNK, QUEUE_NAMES, SqlBase, names
from gpufleet.domain.cluster import Node
from gpufleet.domain.errors import FieldProblem, SpecError, UnknownNameError
from gpufleet.domain.quotas import QueueSpec
from gpufleet.domain.windows import Window

_CLUSTER_VERSION = sa.select(t.meta.c.value).where(t.meta.c.key == t.CLUSTER_VERSION)


class ClusterTables(SqlBase):
    """`queues`, `nodes` and the cluster version counter."""

    # --- StateStore: cluster ------------------------------------------------------------------------------

    def nodes(self) -> tuple[Node, ...]:
        with self._tx(write=False) as c:
            specs = c.execute(sa.select(t.nodes.c.spec).order_by(t.nodes.c.name)).scalars().all()
        return tuple(decode_node(s) for s in specs)

    def queues(self) -> tuple[QueueSpec, ...]:
        with self._tx(write=False) as c:
            specs = c.execute(sa.select(t.queues.c.spec).order_by(t.queues.c.name)).scalars().all()
            deprioritised = self._deprioritised_queues(c)
        queues = (decode_queue(s) for s in specs)
        return tuple(dataclasses.replace(q, deprioritised=True) if q.name in deprioritised else q for q in queues)

    def cluster_version(self) -> int:
        with self._tx(write=False) as c:
            return int(c.execute(_CLUSTER_VERSION).scalar_one())

    def windows(self) -> tuple[Window, ...]:
        with self._tx(write=False) as c:
            specs = c.execute(sa.select(t.windows.c.spec).order_by(t.windows.c.name)).scalars().all()
        return tuple(decode_window(s) for s in specs)

    # --- AdminStore: windows ------------------------------------------------------------------------------

    def set_window(self, window: Window) -> bool:
        """Create or replace a window; bumps the cluster version if anything changed. True if it was new."""
        data = encode_window(window)
        with self._tx(write=True) as c:
            current = c.execute(
                sa.select(t.windows.c.spec).where(t.windows.c.name == window.name).with_for_update()
            ).scalar()
            if current == data:
                return False
            self._upsert(c, t.windows, {"name": window.name, "spec": data})
            self._bump_cluster_version(c)
            return current is None

    def delete_window(self, name: str) -> None:
        """Remove a window; UnknownNameError if there is none of that name."""
        with self._tx(write=True) as c:
            removed = c.execute(sa.delete(t.windows).where(t.windows.c.name == name)).rowcount
            if not removed:
                known = c.execute(sa.select(t.windows.c.name).order_by(t.windows.c.name)).scalars().all()
                raise UnknownNameError(
                    f"reservation {name!r} does not exist",
                    f"name one of: {names(known)}" if known else "there are no reservations",
                )
            self._bump_cluster_version(c)

    # --- AdminStore: queues and nodes ---------------------------------------------------------------------

    def set_queue(self, spec: QueueSpec) -> None:
        """Create or replace a queue; bumps the cluster version if anything changed."""
        data = encode_queue(spec)
        with self._tx(write=True) as c:
            current = c.execute(
                sa.select(t.queues.c.spec).where(t.queues.c.name == spec.name).with_for_update()
            ).scalar()
            if current == data:
                return
            self._upsert(c, t.queues, {"name": spec.name, "spec": data})
            self._bump_cluster_version(c)

    def delete_queue(self, name: str) -> None:
        """Remove a queue. SpecError if it has active jobs or live tokens; UnknownNameError if absent."""
        with self._tx(write=True) as c:
            found = c.execute(sa.select(t.queues.c.name).where(t.queues.c.name == name).with_for_update()).first()
            if found is None:
                known = c.execute(QUEUE_NAMES).scalars().all()
                raise UnknownNameError(
                    f"queue {name!r} does not exist",
                    f"name one of: {names(known)}" if known else "there are no queues",
                )
            active = c.execute(
                sa.select(sa.func.count())
                .select_from(t.jobs)
                .where(t.jobs.c.queue == name, t.jobs.c.state.in_(ACTIVE_STATES))
            ).scalar_one()
            holders = (
                c.execute(
                    sa.select(t.tokens.c.name)
                    .where(t.tokens.c.queue == name, t.tokens.c.revoked.is_(False))
                    .order_by(t.tokens.c.name)
                )
                .scalars()
                .all()
            )
            problems = []
            if active:
                problems.append(
                    FieldProblem(
                        "jobs", f"{active} active", "cancel them or wait until they end, then delete the queue"
                    )
                )
            if holders:
                problems.append(
                    FieldProblem("tokens", f"{len(holders)} issued for it ({names(holders)})", "revoke them first")
                )
            if problems:
                raise SpecError(f"deletion of queue {name!r}", tuple(problems))
            c.execute(sa.delete(t.budgets).where(t.budgets.c.queue == name))
            c.execute(sa.delete(t.queues).where(t.queues.c.name == name))
            self._bump_cluster_version(c)

    def set_nodes(self, nodes: Sequence[Node]) -> None:
        """Replace the inventory, keeping the cordon flag and what they admit of nodes already known by the same
        name; bumps the cluster version if anything changed."""
        twice = sorted(name for name, count in Counter(n.name for n in nodes).items() if count > 1)
        if twice:
            raise SpecError(
                "node inventory",
                tuple(FieldProblem(f"nodes[{n!r}]", "appears twice", "give every node a unique name") for n in twice),
            )
        with self._tx(write=True) as c:
            stored = {
                row.name: row.spec
                for row in c.execute(sa.select(t.nodes.c.name, t.nodes.c.spec).with_for_update()).all()
            }
            wanted: dict[str, dict[str, Any]] = {}
            for node in nodes:
                kept = node
                if node.name in stored:
                    before = stored[node.name]
                    kept = dataclasses.replace(
                        node,
                        cordoned=bool(before.get("cordoned", False)),
                        admits=str(before.get("admits", "all")),
                    )
                wanted[node.name] = encode_node(kept)
            gone = [name for name in stored if name not in wanted]
            changed = [name for name, spec in wanted.items() if stored.get(name) != spec]
            if not gone and not changed:
                return
            for start in range(0, len(gone), CHUNK):
                c.execute(sa.delete(t.nodes).where(t.nodes.c.name.in_(gone[start : start + CHUNK])))
            for name in changed:
                self._upsert(c, t.nodes, {"name": name, "spec": wanted[name]})
            self._bump_cluster_version(c)

    def set_node_flags(
        self, name: str, *, cordoned: bool | None = None, healthy: bool | None = None, admits: str | None = None
    ) -> Node:
        """Cordon/uncordon a node, mark its health, or set what it admits (a spot breaker); bumps the cluster
        version if that changed it."""
        with self._tx(write=True) as c:
            data = c.execute(sa.select(t.nodes.c.spec).where(t.nodes.c.name == name).with_for_update()).scalar()
            if data is None:
                known = c.execute(sa.select(t.nodes.c.name).order_by(t.nodes.c.name)).scalars().all()
                raise UnknownNameError(
                    f"node {name!r} does not exist", f"name one of: {names(known)}" if known else "there are no nodes"
                )
            node = decode_node(data)
            changed = dataclasses.replace(
                node,
                cordoned=node.cordoned if cordoned is None else cordoned,
                healthy=node.healthy if healthy is None else healthy,
                admits=node.admits if admits is None else admits,
            )
            if changed != node:
                c.execute(sa.update(t.nodes).where(t.nodes.c.name == name).values(spec=encode_node(changed)))
                self._bump_cluster_version(c)
        return changed
