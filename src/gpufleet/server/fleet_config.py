"""Declarative fleet config: `gpufleet apply -f fleet.yaml` and `gpufleet export`, as `kubectl apply` does.

One document holds the queues (quotas, cohort, weight, limits, budget), the prices and the token bindings:

    queues:
      team-a: {cohort: research, weight: 2, quotas: {gpu: 8, "gpu:A100-80GB": {nominal: 4, borrowing_limit: 2}},
               budget: {amount: 500, unit: gpu-hours, period: month, action: deprioritise}}
    prices:
      - {model: A100-80GB, pool: on-demand, usd_per_gpu_hour: 3.67, source: our contract}
    tokens:
      - {name: alice, role: team, queue: team-a}

Applying it makes the fleet match the file for what the file names: each queue it lists is created or replaced
whole (a field left out takes its default, a budget left out is removed), each price is set, each token binding
missing is created (its secret is shown once, in the answer). What the file does not name is left alone, unless
`prune`: then queues and prices it does not list are removed. Tokens are never revoked by a file (a file must not
lock its admin out): revoke them with `gpufleet token revoke`. A token named in the file with another role or
queue than the live one of that name is replaced (the old one revoked, a new secret made).

Every entry is checked first, the way the single-object API checks it (queue names and quotas, mapped users,
disk quotas, prices, budgets, token roles, a pruned queue's active jobs and tokens); one bad entry refuses the
whole file and changes nothing. Applying twice changes nothing the second time. `export` writes the fleet's
config in the same format, so `export | apply -f -` is a no-op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.domain.costs import Budget, BudgetAction, BudgetPeriod, BudgetUnit, Price, parse_pool
from gpufleet.domain.errors import FieldProblem, GpufleetError, SpecError
from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.quotas import MEMORY, QueueSpec
from gpufleet.ports.admin import JobQuery, Role, Token
from gpufleet.server.auth import Principal, token_problems
from gpufleet.server.schemas import QueueIn, TokenCreatedOut, TokenIn
from gpufleet.server.schemas_cost import BudgetIn, PoolName
from gpufleet.server.service import Service, check_queue_name
from gpufleet.server.views import from_base, queue_spec

MAX_ENTRIES = 10_000
ACTIVE = frozenset(s for s in JobState if not s.terminal)
Action = Literal["create", "update", "delete"]
Kind = Literal["queue", "budget", "price", "token"]


class QueueConfigIn(QueueIn):
    budget: BudgetIn | None = Field(None, description="The queue's budget; left out: none.")


class PriceConfigIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,99}$")
    pool: PoolName = "on-demand"
    usd_per_gpu_hour: float = Field(ge=0, le=1e6, allow_inf_nan=False)
    source: str = Field("fleet config", max_length=500)


class FleetConfigIn(BaseModel):
    """The fleet's config as a file holds it (`gpufleet export` writes it)."""

    model_config = ConfigDict(extra="forbid")

    queues: dict[str, QueueConfigIn] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    prices: list[PriceConfigIn] = Field(default_factory=list, max_length=MAX_ENTRIES)
    tokens: list[TokenIn] = Field(default_factory=list, max_length=MAX_ENTRIES)


class FleetConfigOut(BaseModel):
    """The fleet's config as `export` writes it: each queue as a person writes it (fields at their default left
    out, sizes as 512GiB), in the format `FleetConfigIn` reads."""

    queues: dict[str, dict[str, Any]]
    prices: list[PriceConfigIn]
    tokens: list[dict[str, Any]]


class ApplyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: FleetConfigIn
    dry_run: bool = Field(False, description="Only say what would change.")
    prune: bool = Field(False, description="Also remove the queues and prices the file does not list.")


class ChangeOut(BaseModel):
    kind: Kind
    name: str
    action: Action
    fields: dict[str, tuple[Any, Any]] = Field(description="field: [live value, the file's value]")


class ApplyOut(BaseModel):
    changes: list[ChangeOut]
    unchanged: int = Field(description="Entries of the file the fleet already matched.")
    applied: bool = Field(description="False on a dry run (or when nothing was to change).")
    tokens: list[TokenCreatedOut] = Field(description="Tokens made by this apply, each secret shown only here.")


@dataclasses.dataclass
class _Step:
    change: ChangeOut
    run: Callable[[], object]


@dataclasses.dataclass
class _Plan:
    """What an apply would do, and what is wrong with the file (then it does nothing)."""

    problems: list[FieldProblem] = dataclasses.field(default_factory=list)
    steps: list[_Step] = dataclasses.field(default_factory=list)
    unchanged: int = 0
    made: list[TokenCreatedOut] = dataclasses.field(default_factory=list)  # filled as tokens are created

    def add(
        self, kind: Kind, name: str, action: Action, fields: dict[str, tuple[Any, Any]], run: Callable[[], object]
    ) -> None:
        self.steps.append(_Step(ChangeOut(kind=kind, name=name, action=action, fields=fields), run))


class FleetConfig:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.store = service.store

    # --- export -------------------------------------------------------------------------------------------

    def export(self, who: Principal) -> FleetConfigOut:
        who.require_admin("exporting the fleet's config")
        budgets = {name: budget for name, (budget, _) in self.store.budgets().items()}
        queues: dict[str, dict[str, Any]] = {}
        for spec in sorted(self.store.queues(), key=lambda q: q.name):
            entry = queue_config(dataclasses.replace(spec, deprioritised=False))
            budget = _budget_config(budgets.get(spec.name))
            queues[spec.name] = entry if budget is None else {**entry, "budget": budget}
        prices = [
            PriceConfigIn(model=p.model, pool=p.pool.value, usd_per_gpu_hour=p.usd_per_gpu_hour, source=p.source)
            for p in sorted(self.store.prices().prices, key=lambda p: (p.model, p.pool.value))
        ]
        tokens = [
            {"name": t.name, "role": t.role.value, **({"queue": t.queue} if t.queue else {})}
            for t in sorted((t for t in self.store.tokens() if not t.revoked), key=lambda t: (t.name, t.created_at))
        ]
        return FleetConfigOut(queues=queues, prices=prices, tokens=tokens)

    # --- apply --------------------------------------------------------------------------------------------

    def apply(self, who: Principal, body: ApplyIn) -> ApplyOut:
        svc = self.service
        svc.audit.require_admin(who, "applying a fleet config", "config.apply", "fleet")
        plan = _Plan()
        live_queues = {q.name: q for q in self.store.queues()}
        self._plan_queues(plan, body.config, live_queues)
        listed = self._plan_prices(plan, body.config)
        pruned = sorted(set(live_queues) - set(body.config.queues)) if body.prune else []
        tokens = [t for t in self.store.tokens() if not t.revoked]
        self._plan_tokens(plan, who, body.config, (set(live_queues) | set(body.config.queues)) - set(pruned), tokens)
        if body.prune:
            self._plan_prune(plan, listed, pruned, live_queues, tokens)
        if plan.problems:
            raise SpecError("fleet config", tuple(plan.problems))
        applied = bool(plan.steps) and not body.dry_run
        if applied:
            for step in plan.steps:
                step.run()
                fields = {key: list(pair) for key, pair in step.change.fields.items()}
                svc.audit.record(who, f"config.{step.change.kind}.{step.change.action}", step.change.name, fields)
            svc.queue_specs.forget()
            svc.fleet_fit.forget()
            svc.auth.forget()
            svc.budgets.check()
            svc.ctx.wake()
        return ApplyOut(
            changes=[s.change for s in plan.steps], unchanged=plan.unchanged, applied=applied, tokens=plan.made
        )

    def _plan_queues(self, plan: _Plan, config: FleetConfigIn, live: Mapping[str, QueueSpec]) -> None:
        budgets = {name: budget for name, (budget, _) in self.store.budgets().items()}
        for name, entry in config.queues.items():
            where = f"queues.{name}"
            try:
                check_queue_name(name)
                spec = queue_spec(name, QueueIn.model_validate(entry.model_dump(exclude={"budget"})))
                budget = None if entry.budget is None else _budget(name, entry.budget)
            except SpecError as error:
                plan.problems.extend(_under(where, error.fields))
                continue
            old = live.get(name)
            if old is not None:  # what a spent budget sets is not the admin's: never a difference with the file
                old = dataclasses.replace(old, deprioritised=False)
            if old == spec:
                plan.unchanged += 1
            else:
                plan.problems.extend(_under(where, self._check_host(name, spec)))
                fields = _diff(queue_config(old) if old else {}, queue_config(spec))
                plan.add("queue", name, "update" if old else "create", fields, _setter(self.store.set_queue, spec))
            current = budgets.get(name)
            if budget != current:
                action: Action = "create" if current is None else ("delete" if budget is None else "update")
                fields = _diff(_budget_config(current) or {}, _budget_config(budget) or {})
                run = _setter(self.store.set_budget, budget) if budget else _setter(self.store.delete_budget, name)
                plan.add("budget", name, action, fields, run)

    def _plan_prices(self, plan: _Plan, config: FleetConfigIn) -> set[tuple[str, str]]:
        """Plan the file's prices; returns their (model, pool) keys."""
        live = {(p.model, p.pool.value): p for p in self.store.prices().prices}
        listed: set[tuple[str, str]] = set()
        now = self.service.ctx.clock.now
        for index, given in enumerate(config.prices):
            key = (given.model, str(given.pool))
            if key in listed:
                plan.problems.append(
                    FieldProblem(f"prices[{index}]", f"{_price_name(key)} is listed twice", "keep one")
                )
                continue
            listed.add(key)
            price = Price(given.model, parse_pool(given.pool), given.usd_per_gpu_hour, given.source)
            old = live.get(key)
            if old == price:
                plan.unchanged += 1
                continue
            fields = _diff(_price_config(old) if old else {}, _price_config(price))
            run = _setter(lambda p: self.store.set_prices([p], now()), price)
            plan.add("price", _price_name(key), "update" if old else "create", fields, run)
        return listed

    def _plan_tokens(
        self, plan: _Plan, who: Principal, config: FleetConfigIn, queues: set[str], live: list[Token]
    ) -> None:
        named: set[str] = set()
        for index, token in enumerate(config.tokens):
            where = f"tokens[{index}]"
            if token.name in named:
                plan.problems.append(FieldProblem(where, f"token {token.name!r} is listed twice", "keep one"))
                continue
            named.add(token.name)
            found = _under(where, token_problems(token.name, Role(token.role), token.queue))
            if token.queue is not None and token.queue not in queues:
                found.append(
                    FieldProblem(
                        f"{where}.queue",
                        f"queue {token.queue!r} does not exist (and the file makes none)",
                        "add the queue to the file, or fix the name",
                    )
                )
            if found:
                plan.problems.extend(found)
                continue
            same = [t for t in live if t.name == token.name]
            if any(t.role.value == token.role and t.queue == token.queue for t in same):
                plan.unchanged += 1
                continue
            fields = _diff(_token_config(same[0]) if same else {}, {"role": token.role, "queue": token.queue})
            plan.add(
                "token", token.name, "update" if same else "create", fields, self._token_step(who, token, same, plan)
            )

    def _plan_prune(
        self,
        plan: _Plan,
        listed: set[tuple[str, str]],
        pruned: list[str],
        live_queues: Mapping[str, QueueSpec],
        tokens: list[Token],
    ) -> None:
        for key, old in sorted(
            (k, p) for p in self.store.prices().prices if (k := (p.model, p.pool.value)) not in listed
        ):
            plan.add("price", _price_name(key), "delete", _diff(_price_config(old), {}), _setter(self._drop_price, key))
        budgets = self.store.budgets()
        for name in pruned:
            plan.problems.extend(self._deletable(name, tokens))
            if name in budgets:
                plan.add("budget", name, "delete", {}, _setter(self.store.delete_budget, name))
            fields = _diff(queue_config(live_queues[name]), {})
            plan.add("queue", name, "delete", fields, _setter(self.store.delete_queue, name))

    def _drop_price(self, key: tuple[str, str]) -> None:
        self.store.delete_price(key[0], parse_pool(key[1]))

    def _check_host(self, name: str, spec: QueueSpec) -> list[FieldProblem]:
        """What this node says of the queue's mapped user and disk quota (as `PUT /v1/queues/NAME` checks)."""
        problems = []
        ctx = self.service.ctx
        if spec.run_as is not None:
            try:
                ctx.check_run_as(spec.run_as)
            except GpufleetError as error:
                problems.append(FieldProblem("run_as", error.message, error.fix))
        try:
            ctx.check_queue_disk(name, spec.run_as, spec.disk)
        except GpufleetError as error:
            problems.append(FieldProblem("disk", error.message, error.fix))
        return problems

    def _deletable(self, name: str, tokens: list[Token]) -> list[FieldProblem]:
        active = self.store.count_jobs(JobQuery(queue=name, states=ACTIVE))
        holders = sorted(t.name for t in tokens if t.queue == name)
        problems = []
        fix = "add the queue to the file, or leave out --prune"
        if active:
            problems.append(
                FieldProblem(
                    f"queues.{name}",
                    f"--prune would delete it, yet {active} of its jobs are active",
                    f"cancel them or wait until they end; or {fix}",
                )
            )
        if holders:
            problems.append(
                FieldProblem(
                    f"queues.{name}",
                    f"--prune would delete it, yet tokens {', '.join(holders)} are bound to it",
                    f"revoke them (`gpufleet token revoke`); or {fix}",
                )
            )
        return problems

    def _token_step(self, who: Principal, token: TokenIn, replaced: list[Token], plan: _Plan) -> Callable[[], object]:
        def run() -> None:
            plan.made.append(self.service.create_token(who, token.name, Role(token.role), token.queue))
            for old in replaced:  # after the new one exists: never a moment without the last admin token
                self.service.revoke_token(who, old.id)

        return run


def queue_config(spec: QueueSpec) -> dict[str, Any]:
    """A queue's fields as a config file writes them (people's units; defaults left out)."""
    quotas: dict[str, Any] = {}
    for key, quota in sorted(spec.quotas.items()):
        parts = {
            part: _amount(key, value)
            for part, value in (
                ("nominal", quota.nominal),
                ("borrowing_limit", quota.borrowing_limit),
                ("lending_limit", quota.lending_limit),
            )
            if value is not None
        }
        quotas[key] = parts["nominal"] if list(parts) == ["nominal"] else parts
    found: dict[str, Any] = {
        "quotas": quotas,
        "cohort": spec.cohort,
        "weight": spec.weight,
        "max_pending": spec.max_pending,
        "run_as": spec.run_as,
        "max_grace": spec.max_grace_s,
        "memory_per_gpu": _size(spec.memory_per_gpu),
        "memory_no_gpu": _size(spec.memory_no_gpu),
        "disk": _size(spec.disk),
    }
    defaults = QueueIn.model_validate({}).model_dump()
    return {key: value for key, value in found.items() if value != defaults.get(key) or key == "quotas"}


def _amount(key: str, value: int) -> Any:
    if key == MEMORY:
        return _size(value)
    number = from_base(key, value)
    return int(number) if number is not None and number == int(number) else number


def _size(value: int | None) -> int | str | None:
    """Bytes as `512GiB` where that is exact, else as bytes."""
    if value is None:
        return None
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= factor and value % factor == 0:
            return f"{value // factor}{unit}"
    return value


def _budget(queue: str, given: BudgetIn) -> Budget:
    return Budget(queue, given.amount, BudgetUnit(given.unit), BudgetPeriod(given.period), BudgetAction(given.action))


def _budget_config(budget: Budget | None) -> dict[str, Any] | None:
    if budget is None:
        return None
    return {
        "amount": budget.amount,
        "unit": budget.unit.value,
        "period": budget.period.value,
        "action": budget.action.value,
    }


def _price_config(price: Price) -> dict[str, Any]:
    return {"usd_per_gpu_hour": price.usd_per_gpu_hour, "source": price.source}


def _price_name(key: tuple[str, str]) -> str:
    return f"{key[0]} ({key[1]})"


def _token_config(token: Token) -> dict[str, Any]:
    return {"role": token.role.value, "queue": token.queue}


def _diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {key: (old.get(key), new.get(key)) for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)}


def _under(where: str, fields: tuple[FieldProblem, ...] | list[FieldProblem]) -> list[FieldProblem]:
    return [FieldProblem(f"{where}.{f.field}" if f.field else where, f.problem, f.fix) for f in fields]


def _setter(write: Callable[[Any], object], value: Any) -> Callable[[], object]:
    return lambda: write(value)


__all__ = ["ApplyIn", "ApplyOut", "FleetConfig", "FleetConfigIn", "FleetConfigOut", "queue_config"]
