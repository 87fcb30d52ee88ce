"""An API on the real SQL store (SQLite in a temporary folder) with two team queues and three tokens."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

with warnings.catch_warnings():
    # Starlette 1.x suggests the httpx2 package for its test client; httpx works and is what we ship.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.domain.cluster import make_node
from gpufleet.domain.quotas import GPU, QueueSpec, Quota
from gpufleet.domain.resources import GiB
from gpufleet.ports.admin import Role
from gpufleet.server.auth import bootstrap_admin, create_token
from gpufleet.server.context import ApiContext
from gpufleet.server.http_app import create_app


class StepClock:
    """A clock that moves only when told: times in answers are exact."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t


@dataclass
class Api:
    client: TestClient
    store: SqlStore
    ctx: ApiContext
    clock: StepClock
    admin: str
    team_a: str
    team_b: str
    wakes: list[int] = field(default_factory=list)
    logs: dict[str, list[Path]] = field(default_factory=dict)

    def h(self, secret: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {secret}"}

    def as_admin(self) -> dict[str, str]:
        return self.h(self.admin)


def make_store(tmp_path: Path) -> SqlStore:
    store = SqlStore.open(default_sqlite_url(tmp_path))
    store.set_nodes(
        [
            make_node("node-a", "A100-80GB", 4, 80 * GiB, cpu_milli=64_000, memory=512 * GiB),
            make_node("node-h", "H100", 2, 80 * GiB, cpu_milli=32_000, memory=256 * GiB),
        ]
    )
    store.set_queue(QueueSpec("team-a", {GPU: Quota(4000)}, cohort="lab"))
    store.set_queue(QueueSpec("team-b", {GPU: Quota(2000)}, cohort="lab"))
    store.set_queue(QueueSpec("default"))
    return store


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    store = make_store(tmp_path)
    clock = StepClock()
    admin = bootstrap_admin(store, clock)
    assert admin is not None
    _, team_a = create_token(store, clock, "alice", Role.TEAM, "team-a")
    _, team_b = create_token(store, clock, "bob", Role.TEAM, "team-b")
    wakes: list[int] = []
    logs: dict[str, list[Path]] = {}
    ctx = ApiContext(
        store=store,
        clock=clock,
        log_paths=lambda job_id: logs.get(job_id, []),
        wake=lambda: wakes.append(1),
        emulated=True,
        inventory_source="emulated: test",
        policy="default",
    )
    with TestClient(create_app(ctx), raise_server_exceptions=False) as client:
        yield Api(client, store, ctx, clock, admin, team_a, team_b, wakes, logs)
    store.close()
