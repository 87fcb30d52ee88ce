"""The running jobs' arrays and quota usage a state keeps across cycles (`RunningLayout`: appended to as jobs
start, dead owners dropped by compaction) are what a state built afresh from the same running jobs lays out,
after random sequences of starts, stops, preemptions, checkpoints and forks that change their own running jobs."""

from __future__ import annotations

import dataclasses
from unittest.mock import patch

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.jobs import JobId, RunningJob
from gpufleet.scheduling import running_layout
from gpufleet.scheduling import state as state_module
from gpufleet.scheduling.state import CycleState
from gpufleet.scheduling.table import WorkerArrays
from tests.property.strategies import World, worlds

OPS = ("stop", "start", "turnover", "preempt", "checkpoint", "fork", "what-if")


def _rows(arrays: WorkerArrays, owner: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """One owner's worker rows and share rows, sorted (their order among the rows is not part of the contract)."""
    workers = arrays.owner == owner
    shares = arrays.share_owner == owner
    return (
        sorted(
            zip(
                arrays.node[workers].tolist(),
                arrays.cpu[workers].tolist(),
                arrays.memory[workers].tolist(),
                strict=True,
            )
        ),
        sorted(
            zip(
                arrays.share_node[shares].tolist(),
                arrays.share_gpu[shares].tolist(),
                arrays.share_milli[shares].tolist(),
                arrays.share_memory[shares].tolist(),
                strict=True,
            )
        ),
    )


def _assert_laid_out_as_fresh(state: CycleState) -> None:
    """Every running job of `state` has an owner number whose rows and usage are the job's, and no other job has."""
    running = {job_id for job_id, h in state.holdings.items() if h.running is not None}
    position, arrays, owners = state.running_arrays()
    assert set(position) == running
    assert len(set(position.values())) == len(position)
    assert all(0 <= k < owners for k in position.values())
    assert int(arrays.owner.max(initial=-1)) < owners
    assert int(arrays.share_owner.max(initial=-1)) < owners
    keys, usage, queues, queue_of = state._running_usage()
    assert keys == sorted(keys)
    assert queues == sorted(queues)
    assert usage.shape == (owners, len(keys))
    assert queue_of.shape == (owners,)
    for job_id in running:
        holding = state.holdings[job_id]
        k = position[job_id]
        assert _rows(arrays, k) == _rows(WorkerArrays.of(state.table, holding.workers), 0)
        assert {key: int(usage[k, i]) for i, key in enumerate(keys) if usage[k, i]} == {
            key: amount for key, amount in holding.usage if amount
        }
        assert queues[int(queue_of[k])] == holding.job.queue


def _assert_what_if_as_fresh(state: CycleState, ids: list[JobId]) -> None:
    """Taking `ids` out at once (over the kept arrays) leaves the table and the ledger a fresh state leaves."""
    snapshot = dataclasses.replace(
        state.snapshot, running=tuple(h.running for h in state.holdings.values() if h.running is not None)
    )
    fresh = CycleState(snapshot)
    for a in (state, fresh):
        a.remove_many(ids)
    try:
        assert np.array_equal(state.table.gpu_milli_free, fresh.table.gpu_milli_free)
        assert np.array_equal(state.table.gpu_mem_free, fresh.table.gpu_mem_free)
        assert np.array_equal(state.table.cpu_free, fresh.table.cpu_free)
        assert np.array_equal(state.table.mem_free, fresh.table.mem_free)
        for queue in set(state.ledger.usage) | set(fresh.ledger.usage):
            kept = {k: v for k, v in state.ledger.usage.get(queue, {}).items() if v}
            assert kept == {k: v for k, v in fresh.ledger.usage.get(queue, {}).items() if v}
        pooled = {k: v for k, v in state.ledger.pool_used.items() if v}
        assert pooled == {k: v for k, v in fresh.ledger.pool_used.items() if v}
    finally:
        state.restore_many(ids)


@settings(max_examples=80, deadline=None)
@given(worlds(max_pending=2), st.data(), st.sampled_from((1, 3, 10**9)))
def test_kept_running_arrays_are_a_fresh_layout(world: World, data: st.DataObject, compact_from: int) -> None:
    """Through random starts, stops (ends and preemptions finished), preemptions begun, checkpoints and forks,
    the kept layout gives each running job its own rows and usage, and what-ifs over it (arrays path forced)
    leave the table and the ledger as a state built afresh does. Compaction is forced often (`compact_from`)."""
    with (
        patch.object(running_layout, "COMPACT_FROM", compact_from),
        patch.object(state_module, "SHIFT_ARRAYS_FROM", 2),
    ):
        state = CycleState(world.snapshot)
        stopped: list[RunningJob] = []
        for _ in range(data.draw(st.integers(1, 25), label="steps")):
            live = sorted(j for j, h in state.holdings.items() if h.running is not None)
            op = data.draw(st.sampled_from(OPS), label="op")
            if op == "stop" and live:
                job_id = data.draw(st.sampled_from(live))
                running = state.holdings[job_id].running
                assert running is not None
                state.remove_running(job_id)
                stopped.append(running)
            elif op == "start" and stopped:
                # A job that stopped starts again where it ran (a new object: a new attempt).
                again = stopped.pop(data.draw(st.integers(0, len(stopped) - 1)))
                state.add_running(dataclasses.replace(again, started_at=again.started_at + 1.0, evicting_for=None))
            elif op == "turnover" and live:
                # Several jobs end and start again (new attempts) between two reads: appended together.
                again = []
                for job_id in data.draw(st.lists(st.sampled_from(live), unique=True, min_size=1)):
                    running = state.holdings[job_id].running
                    assert running is not None
                    state.remove_running(job_id)
                    again.append(running)
                for running in data.draw(st.permutations(again)):
                    state.add_running(dataclasses.replace(running, started_at=running.started_at + 1.0))
            elif op == "preempt" and live:
                state.set_evicting(data.draw(st.sampled_from(live)), "p00")
            elif op == "checkpoint" and live:
                state.set_checkpoint(data.draw(st.sampled_from(live)), 1.0)
            elif op == "fork":
                # A copy that changes its own running jobs (as a resize does) leaves the original's layout alone.
                fork = state.copy(state.now)
                fork_live = list(live)
                for job_id in data.draw(st.lists(st.sampled_from(live), unique=True, max_size=3)) if live else []:
                    fork.remove_running(job_id)
                    fork_live.remove(job_id)
                _assert_laid_out_as_fresh(fork)
                if fork_live:
                    _assert_what_if_as_fresh(fork, data.draw(st.lists(st.sampled_from(fork_live), unique=True)))
            elif op == "what-if" and live:
                _assert_what_if_as_fresh(state, data.draw(st.lists(st.sampled_from(live), unique=True)))
            if data.draw(st.booleans(), label="read now"):  # else more changes before the next read
                _assert_laid_out_as_fresh(state)
        _assert_laid_out_as_fresh(state)
