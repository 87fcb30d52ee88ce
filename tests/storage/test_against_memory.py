"""A property test: any sequence of submits, writes (fresh or stale) and requests leaves the SQLite store
in the same state as the in-memory reference, as the loop and the API see it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.domain import TRANSITIONS, QueueSpec
from gpufleet.domain.lifecycle import Transition
from gpufleet.ports import RequestKind, StaleWriteError
from tests.storage.test_contract import job

QUEUES = ("default", "team-a")


class SameAsMemory(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="gpufleet-store-"))
        self.sql = SqlStore.open(default_sqlite_url(self.folder))
        self.memory = InMemoryStore(queues=[QueueSpec(q) for q in QUEUES])
        self.submitted = 0
        self.cursors = {"sql": 0, "memory": 0}
        self.request_cursors = {"sql": 0, "memory": 0}

    @initialize()
    def queues(self) -> None:
        for name in QUEUES:
            self.sql.set_queue(QueueSpec(name))

    @rule(queue=st.sampled_from(QUEUES), priority=st.integers(-3, 3), at=st.floats(0, 1e6))
    def submit(self, queue: str, priority: int, at: float) -> None:
        # The SQL store numbers jobs itself; give the in-memory one the same number.
        self.submitted += 1
        spec = job(f"j{self.submitted}", queue, priority=priority, submit_seq=self.submitted)
        assert self.sql.submit(spec, at) == self.memory.submit(spec, at)

    @precondition(lambda self: self.submitted > 0)
    @rule(pick=st.integers(0, 10**6), choice=st.integers(0, 10), stale=st.booleans(), at=st.floats(0, 1e6))
    def move(self, pick: int, choice: int, stale: bool, at: float) -> None:
        record = self.memory.get(f"j{pick % self.submitted + 1}")
        assert record is not None
        targets = sorted(t for (s, t) in TRANSITIONS if s is record.state)
        if not targets:
            return
        target = targets[choice % len(targets)]
        new = record.evolve(state=target, reason=f"to {target.value}", attempt=record.attempt + 1)
        expected = record.version - 1 if stale else record.version
        transition = Transition(record.id, record.state, target, new.reason, at)
        outcomes = []
        for store in (self.sql, self.memory):
            try:
                store.write([(expected, new)], [transition])
                outcomes.append("written")
            except StaleWriteError:
                outcomes.append("stale")
        assert outcomes == ["stale", "stale"] if stale else ["written", "written"]

    @precondition(lambda self: self.submitted > 0)
    @rule(pick=st.integers(0, 10**6), kind=st.sampled_from(RequestKind), at=st.floats(0, 1e6))
    def request(self, pick: int, kind: RequestKind, at: float) -> None:
        job_id = f"j{pick % self.submitted + 1}"
        self.sql.request(job_id, kind, "asked", at)
        self.memory.request(job_id, kind, "asked", at)

    @rule()
    def take(self) -> None:
        taken_sql, self.cursors["sql"] = self.sql.take_submissions(self.cursors["sql"])
        taken_memory, self.cursors["memory"] = self.memory.take_submissions(self.cursors["memory"])
        assert list(taken_sql) == list(taken_memory)
        requests_sql, self.request_cursors["sql"] = self.sql.take_requests(self.request_cursors["sql"])
        requests_memory, self.request_cursors["memory"] = self.memory.take_requests(self.request_cursors["memory"])
        assert [(r.job_id, r.kind, r.at) for r in requests_sql] == [(r.job_id, r.kind, r.at) for r in requests_memory]

    @invariant()
    def same_state(self) -> None:
        assert list(self.sql.active()) == list(self.memory.active())
        for n in range(1, self.submitted + 1):
            assert self.sql.get(f"j{n}") == self.memory.get(f"j{n}")
            assert list(self.sql.history(f"j{n}")) == list(self.memory.history(f"j{n}"))

    def teardown(self) -> None:
        self.sql.close()
        shutil.rmtree(self.folder, ignore_errors=True)


SameAsMemory.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
test_sql_store_behaves_like_the_in_memory_store = SameAsMemory.TestCase
