"""The job state machine: every edge of TRANSITIONS is accepted, every other pair is refused."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain import TRANSITIONS, InvalidTransitionError, Job, JobState, Transition, WorkerRequest, transition
from gpufleet.domain.lifecycle import TERMINAL
from gpufleet.domain.records import JobRecord, StopCause

S = JobState
EDGES = sorted(TRANSITIONS, key=lambda e: (e[0].value, e[1].value))
NON_EDGES = [(a, b) for a, b in itertools.product(S, S) if (a, b) not in TRANSITIONS]


@pytest.mark.parametrize(("source", "target"), [pytest.param(a, b, id=f"{a}->{b}") for a, b in EDGES])
def test_table_edges_are_accepted_and_recorded(source: JobState, target: JobState) -> None:
    record = transition("j1", source, target, "because", at=12.5)
    assert record == Transition("j1", source, target, "because", 12.5)
    assert TRANSITIONS[(source, target)], "every edge has a comment"


@pytest.mark.parametrize(("source", "target"), [pytest.param(a, b, id=f"{a}->{b}") for a, b in NON_EDGES])
def test_other_transitions_are_refused(source: JobState, target: JobState) -> None:
    with pytest.raises(InvalidTransitionError, match=f"cannot go from {source.value} to {target.value}") as caught:
        transition("j1", source, target, "because", at=0.0)
    assert caught.value.fix.startswith(f"from {source.value} it may go to: ")


@pytest.mark.parametrize(
    ("source", "allowed"),
    [
        pytest.param(S.PENDING, "admitted, cancelled, failed, held", id="pending"),
        pytest.param(S.HELD, "cancelled, pending", id="held"),
        pytest.param(S.ADMITTED, "cancelled, launching, pending", id="admitted"),
        pytest.param(S.LAUNCHING, "evicting, failed, pending, running", id="launching"),
        pytest.param(S.RUNNING, "evicting, failed, pending, running, succeeded", id="running"),
        pytest.param(S.EVICTING, "cancelled, failed, pending, succeeded", id="evicting"),
        pytest.param(S.SUCCEEDED, "nothing (terminal)", id="succeeded"),
        pytest.param(S.FAILED, "nothing (terminal)", id="failed"),
        pytest.param(S.CANCELLED, "nothing (terminal)", id="cancelled"),
    ],
)
def test_the_refusal_lists_what_is_allowed(source: JobState, allowed: str) -> None:
    target = S.SUCCEEDED if source is not S.SUCCEEDED else S.RUNNING
    if (source, target) in TRANSITIONS:
        target = S.ADMITTED
    with pytest.raises(InvalidTransitionError) as caught:
        transition("j", source, target, "x", at=0.0)
    assert caught.value.fix == f"from {source.value} it may go to: {allowed}"


def test_a_transition_needs_a_reason() -> None:
    with pytest.raises(InvalidTransitionError, match="has no reason"):
        transition("j", S.PENDING, S.ADMITTED, "", at=0.0)


def test_terminal_states_have_no_way_out() -> None:
    assert {s for s in S if s.terminal} == TERMINAL == {S.SUCCEEDED, S.FAILED, S.CANCELLED}
    assert not [edge for edge in TRANSITIONS if edge[0] in TERMINAL]


def test_every_non_terminal_state_is_reachable_and_can_end() -> None:
    reachable = {S.PENDING}
    frontier = [S.PENDING]
    while frontier:
        state = frontier.pop()
        for a, b in TRANSITIONS:
            if a is state and b not in reachable:
                reachable.add(b)
                frontier.append(b)
    assert reachable == set(S)
    for state in S:
        if not state.terminal:
            assert any(a is state and b.terminal for a, b in TRANSITIONS), state


_RECORD_CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "state": st.sampled_from(list(S)),
        "attempt": st.integers(0, 5),
        "started_at": st.none() | st.floats(0, 1e6),
        "finished_at": st.none() | st.floats(0, 1e6),
        "reason": st.text(max_size=8),
        "evicting_for": st.none() | st.text(max_size=4),
        "stop_cause": st.none() | st.sampled_from(list(StopCause)),
        "preemptions": st.integers(0, 9),
        "attained_gpu_seconds": st.floats(0, 1e6),
        "resizing": st.booleans(),
    },
)


@settings(max_examples=100, deadline=None)
@given(first=_RECORD_CHANGES, second=_RECORD_CHANGES)
def test_a_record_evolves_into_the_next_version_with_only_the_changes(
    first: dict[str, object], second: dict[str, object]
) -> None:
    job = Job(id="j1", queue="team", request=WorkerRequest(gpus=1))
    record = JobRecord(job, S.PENDING).evolve(**first)
    evolved = record.evolve(**second)
    assert evolved == dataclasses.replace(record, version=record.version + 1, **second)  # type: ignore[arg-type]
    assert evolved.version == 3
    assert record.version == 2


def test_a_record_refuses_to_evolve_a_field_it_lacks_or_its_version() -> None:
    record = JobRecord(Job(id="j1", queue="team", request=WorkerRequest(gpus=1)), S.PENDING)
    for bad in ({"colour": "red"}, {"version": 7}):
        with pytest.raises(TypeError, match=next(iter(bad))):
            record.evolve(**bad)
