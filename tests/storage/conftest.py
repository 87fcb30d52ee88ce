"""Stores under test: the in-memory reference, SQLite in a temporary folder, and PostgreSQL (a fresh
database on the session's private server, see tests/kit/postgres.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.domain import Node, QueueSpec
from tests.kit.postgres import PostgresServer

SQL_KINDS = ["sqlite", "postgres"]
ALL_KINDS = ["memory", *SQL_KINDS]


@dataclass
class Harness:
    """A store and what differs between kinds: how to set the cluster, how to reopen."""

    kind: str
    store: InMemoryStore | SqlStore
    url: str | None = None
    opened: list[SqlStore] = field(default_factory=list)

    @property
    def durable(self) -> bool:
        return self.url is not None

    @property
    def sql(self) -> SqlStore:
        assert isinstance(self.store, SqlStore)
        return self.store

    def set_cluster(self, nodes: Sequence[Node] | None = None, queues: Sequence[QueueSpec] | None = None) -> None:
        if isinstance(self.store, InMemoryStore):
            self.store.set_cluster(nodes, queues)
            return
        if queues is not None:
            for spec in queues:
                self.store.set_queue(spec)
        if nodes is not None:
            self.store.set_nodes(nodes)

    def open_another(self) -> SqlStore:
        """A second store on the same database, as another process would have."""
        assert self.url is not None
        other = SqlStore.open(self.url)
        self.opened.append(other)
        return other

    def reopen(self) -> SqlStore:
        """Close the store and open the database again."""
        assert isinstance(self.store, SqlStore)
        assert self.url is not None
        self.store.close()
        self.store = self.open_another()
        return self.store

    def close(self) -> None:
        for store in (self.store, *self.opened):
            if isinstance(store, SqlStore):
                store.close()


@pytest.fixture(scope="session")
def postgres_migrated(postgres_server: PostgresServer) -> str:
    """The name of a database migrated to head, to copy for each test (faster than migrating each one)."""
    url = postgres_server.create_database()
    SqlStore.open(url).close()
    return url.rsplit("/", 1)[1]


def sql_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path, *, migrated: bool = True) -> str:
    """A fresh database of `kind`: SQLite in `tmp_path`, or PostgreSQL, empty or already migrated."""
    if kind == "sqlite":
        return default_sqlite_url(tmp_path / "data")
    if not migrated:
        return str(request.getfixturevalue("postgres_url"))
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.create_database(template=request.getfixturevalue("postgres_migrated"))
    request.addfinalizer(lambda: server.drop_database(url))
    return url


@pytest.fixture
def harness_of(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[str], Harness]]:
    made: list[Harness] = []

    def make(kind: str) -> Harness:
        if kind == "memory":
            harness = Harness(kind, InMemoryStore())
        else:
            url = sql_url(kind, request, tmp_path)
            harness = Harness(kind, SqlStore.open(url), url)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()


@pytest.fixture(params=ALL_KINDS)
def any_store(request: pytest.FixtureRequest, harness_of: Callable[[str], Harness]) -> Harness:
    """Each kind of store, with queues `default` and `team-a`."""
    harness = harness_of(request.param)
    harness.set_cluster(queues=[QueueSpec("default"), QueueSpec("team-a")])
    return harness


@pytest.fixture(params=SQL_KINDS)
def sql(request: pytest.FixtureRequest, harness_of: Callable[[str], Harness]) -> Harness:
    """Each SQL store, with queues `default` and `team-a`."""
    harness = harness_of(request.param)
    harness.set_cluster(queues=[QueueSpec("default"), QueueSpec("team-a")])
    return harness
