"""The SQL store's cost tables: GPU prices, each job attempt's priced GPUs (`charges`), and queue budgets.

An attempt is priced in the same transaction that records its move into holding resources (`_charge_started`,
called by `JobTables.write`), from the nodes and prices stored at that moment: so a report bills each attempt
at the price it started under, and a job that held GPUs for a second is billed like one that held them a day.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from gpufleet.adapters.storage import schema as t
from gpufleet.adapters.storage.codec import decode_node
from gpufleet.adapters.storage.sql_base import SqlBase
from gpufleet.domain.checkpoints import AttemptLoss, LossCause
from gpufleet.domain.cluster import Node
from gpufleet.domain.costs import (
    Budget,
    BudgetAction,
    BudgetLevel,
    BudgetPeriod,
    BudgetUnit,
    Charge,
    Pool,
    Price,
    PriceTable,
    charges_for,
)
from gpufleet.domain.errors import UnknownNameError
from gpufleet.domain.lifecycle import JobState, Transition
from gpufleet.domain.records import JobRecord
from gpufleet.domain.throughput_table import model_key

HOLDING = frozenset({JobState.ADMITTED, JobState.LAUNCHING, JobState.RUNNING, JobState.EVICTING})


_CLUSTER_VERSION = sa.select(t.meta.c.value).where(t.meta.c.key == t.CLUSTER_VERSION)
_NODE_SPECS = sa.select(t.nodes.c.spec)


class CostTables(SqlBase):
    """`prices`, `charges` and `budgets`."""

    def __init__(self, engine: sa.Engine, url: str) -> None:
        super().__init__(engine, url)
        # The nodes as stored at a cluster version (every change of a node bumps it), decoded once for all the
        # writes that price attempts until the next change, instead of once per write.
        self._priced_nodes: tuple[int, dict[str, Node]] = (-1, {})

    # --- prices ---------------------------------------------------------------------------------------------

    def prices(self) -> PriceTable:
        with self._tx(write=False) as c:
            return _price_table(c)

    def set_prices(self, prices: Iterable[Price], at: float) -> None:
        """Set these prices (replacing the same model and pool), all or none."""
        with self._tx(write=True) as c:
            for price in prices:
                self._upsert(
                    c,
                    t.prices,
                    {
                        "model": model_key(price.model),
                        "pool": price.pool.value,
                        "shown_model": price.model.strip(),
                        "usd_per_gpu_hour": price.usd_per_gpu_hour,
                        "source": price.source,
                        "updated_at": at,
                    },
                )

    def delete_price(self, model: str, pool: Pool) -> None:
        with self._tx(write=True) as c:
            result = c.execute(
                sa.delete(t.prices).where(t.prices.c.model == model_key(model), t.prices.c.pool == pool.value)
            )
            if result.rowcount == 0:
                raise UnknownNameError(f"no price is set for {model} ({pool})", "list the prices: gpufleet price list")

    # --- charges ----------------------------------------------------------------------------------------------

    def _charge_started(
        self, c: sa.Connection, records: Mapping[str, JobRecord], transitions: Sequence[Transition]
    ) -> None:
        """Price the attempts that begin holding resources in this write (called inside its transaction)."""
        starts = [
            tr for tr in transitions if tr.target in HOLDING and tr.source not in HOLDING and tr.job_id in records
        ]
        if not starts:
            return
        nodes = self._nodes_at_version(c)
        prices = _price_table(c)
        rows: dict[tuple[str, float, str, str], dict[str, Any]] = {}  # by primary key: the last one wins
        for tr in starts:
            for charge in charges_for(records[tr.job_id].workers, nodes, prices):
                rows[(tr.job_id, tr.at, charge.model, charge.pool.value)] = {
                    "job_id": tr.job_id,
                    "started_at": tr.at,
                    "model": charge.model,
                    "pool": charge.pool.value,
                    "gpus": charge.gpus,
                    "usd_per_gpu_hour": charge.usd_per_gpu_hour,
                }
        self._upsert_many(c, t.charges, list(rows.values()))

    def _nodes_at_version(self, c: sa.Connection) -> dict[str, Node]:
        """The stored nodes by name, decoded again only when the cluster version has moved. The version is read
        before the nodes: a change committed between the two reads is seen at the next write, which finds a
        newer version than the one kept."""
        version = int(c.execute(_CLUSTER_VERSION).scalar_one())
        kept_version, nodes = self._priced_nodes
        if version != kept_version:
            nodes = {n.name: n for n in (decode_node(s) for s in c.execute(_NODE_SPECS).scalars())}
            self._priced_nodes = (version, nodes)
        return nodes

    def charges(self, job_ids: Sequence[str]) -> dict[str, dict[float, tuple[Charge, ...]]]:
        """Per job, per the start time of each attempt, what it held and at what price."""
        out: dict[str, dict[float, list[Charge]]] = {}
        ids = sorted(set(job_ids))
        with self._tx(write=False) as c:
            for first in range(0, len(ids), 500):
                rows = c.execute(sa.select(t.charges).where(t.charges.c.job_id.in_(ids[first : first + 500]))).all()
                for r in rows:
                    out.setdefault(r.job_id, {}).setdefault(float(r.started_at), []).append(
                        Charge(r.model, Pool(r.pool), float(r.gpus), r.usd_per_gpu_hour)
                    )
        return {job: {at: tuple(items) for at, items in per.items()} for job, per in out.items()}

    # --- work lost by attempts ----------------------------------------------------------------------------------

    def _record_losses(
        self, c: sa.Connection, records: Mapping[str, JobRecord], transitions: Sequence[Transition]
    ) -> None:
        """Keep the work lost by the attempts that end in this write (called inside its transaction)."""
        rows: dict[str, dict[str, Any]] = {}
        for tr in transitions:
            record = records.get(tr.job_id)
            if tr.source not in HOLDING or tr.target in HOLDING or record is None:
                continue
            loss = record.attempt_loss
            if loss is None or loss.ended_at != tr.at:
                continue
            rows[tr.job_id] = {"job_id": tr.job_id, **loss.to_dict()}
        self._upsert_many(c, t.attempt_losses, list(rows.values()))

    def attempt_losses(self, since: float, until: float) -> list[tuple[str, AttemptLoss]]:
        """(job id, loss) of every attempt that ended in [since, until], oldest first."""
        table = t.attempt_losses
        query = (
            sa.select(table)
            .where(table.c.ended_at >= since, table.c.ended_at <= until)
            .order_by(table.c.ended_at, table.c.job_id)
        )
        with self._tx(write=False) as c:
            rows = c.execute(query).all()
        return [
            (r.job_id, AttemptLoss(r.attempt, LossCause(r.cause), r.started_at, r.ended_at, r.lost_s, r.gpus))
            for r in rows
        ]

    # --- budgets ----------------------------------------------------------------------------------------------

    def budgets(self) -> dict[str, tuple[Budget, BudgetLevel]]:
        """Every queue's budget and the level it was last found at."""
        with self._tx(write=False) as c:
            rows = c.execute(sa.select(t.budgets).order_by(t.budgets.c.queue)).all()
        return {r.queue: (_budget(r), BudgetLevel(r.level)) for r in rows}

    def set_budget(self, budget: Budget) -> None:
        """Set a queue's budget (UnknownNameError for a queue that does not exist); its level is kept."""
        with self._tx(write=True) as c:
            if c.execute(sa.select(t.queues.c.name).where(t.queues.c.name == budget.queue)).first() is None:
                raise UnknownNameError(f"queue {budget.queue!r} does not exist", "create the queue first")
            before = c.execute(sa.select(t.budgets).where(t.budgets.c.queue == budget.queue)).first()
            level = before.level if before is not None else BudgetLevel.OK.value
            self._upsert(
                c,
                t.budgets,
                {
                    "queue": budget.queue,
                    "amount": budget.amount,
                    "unit": budget.unit.value,
                    "period": budget.period.value,
                    "action": budget.action.value,
                    "level": level,
                    "level_at": None if before is None else before.level_at,
                },
            )
            if before is None or _deprioritised(before) != _deprioritised_values(budget.action.value, level):
                self._bump_cluster_version(c)

    def delete_budget(self, queue: str) -> None:
        with self._tx(write=True) as c:
            before = c.execute(sa.select(t.budgets).where(t.budgets.c.queue == queue)).first()
            if before is None:
                raise UnknownNameError(f"queue {queue!r} has no budget", "list budgets: gpufleet budget list")
            c.execute(sa.delete(t.budgets).where(t.budgets.c.queue == queue))
            if _deprioritised(before):
                self._bump_cluster_version(c)

    def set_budget_level(self, queue: str, level: BudgetLevel, at: float) -> None:
        """Record the level a queue's budget is at; the loop sees a change of deprioritisation at its next step."""
        with self._tx(write=True) as c:
            before = c.execute(sa.select(t.budgets).where(t.budgets.c.queue == queue).with_for_update()).first()
            if before is None or before.level == level.value:
                return
            c.execute(sa.update(t.budgets).where(t.budgets.c.queue == queue).values(level=level.value, level_at=at))
            if _deprioritised(before) != _deprioritised_values(before.action, level.value):
                self._bump_cluster_version(c)

    def _deprioritised_queues(self, c: sa.Connection) -> frozenset[str]:
        rows = c.execute(
            sa.select(t.budgets.c.queue).where(
                t.budgets.c.level == BudgetLevel.EXCEEDED.value, t.budgets.c.action == BudgetAction.DEPRIORITISE.value
            )
        ).scalars()
        return frozenset(rows)


def _price_table(c: sa.Connection) -> PriceTable:
    rows = c.execute(sa.select(t.prices).order_by(t.prices.c.model, t.prices.c.pool)).all()
    return PriceTable(tuple(Price(r.shown_model, Pool(r.pool), float(r.usd_per_gpu_hour), r.source) for r in rows))


def _budget(row: sa.Row[Any]) -> Budget:
    return Budget(
        row.queue, float(row.amount), BudgetUnit(row.unit), BudgetPeriod(row.period), BudgetAction(row.action)
    )


def _deprioritised_values(action: str, level: str) -> bool:
    return action == BudgetAction.DEPRIORITISE.value and level == BudgetLevel.EXCEEDED.value


def _deprioritised(row: sa.Row[Any]) -> bool:
    return _deprioritised_values(row.action, row.level)
