"""When the loop's resize step runs: at each interval, and early once more jobs wait while elastic jobs run."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.control.resize import Resizer
from gpufleet.policies.catalog import profile


def resizer() -> Resizer:
    prof = profile("default")
    assert prof.resize is not None
    return Resizer(prof.resize, prof, None)


def test_a_new_waiting_job_brings_the_step_forward_only_while_elastic_jobs_run() -> None:
    r = resizer()
    assert r.due(0.0, 0)  # the first call
    assert not r.due(10.0, 1)  # more waiting, but no elastic job runs: the interval holds
    r.active = True
    assert r.due(20.0, 2)  # one more waits: now
    assert not r.due(30.0, 2)  # as many as before: the interval holds
    assert not r.due(40.0, 1)  # fewer
    assert r.due(50.0, 2)  # one more again
    assert r.due(60.0, 0)  # the interval


@given(st.lists(st.tuples(st.floats(0, 30), st.integers(0, 5)), max_size=30), st.booleans())
def test_the_interval_still_holds_whatever_waits(calls: list[tuple[float, int]], active: bool) -> None:
    r = resizer()
    now, waiting, last_periodic = 0.0, 0, None
    for gap, count in calls:
        now += gap
        r.active = active
        early = active and count > waiting
        due = r.due(now, count)
        if not early:
            periodic = last_periodic is None or now >= (last_periodic // r.every_s + 1) * r.every_s
            assert due == periodic
            if due:
                last_periodic = now
        else:
            assert due
        waiting = count
