"""A deadline for work that may hang rather than fail (an engine's start, a cluster's stop)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def within(seconds: float, what: str, work: Callable[[], T]) -> T:
    """Run `work` in this (the main) thread, failing the test if it takes longer than `seconds`. The alarm is a
    signal, so the work stays in the main thread (Ray installs signal handlers: it cannot move to another)."""

    def expired(_signo: int, _frame: object) -> None:
        raise TimeoutError(f"{what} took more than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return work()
    except TimeoutError as error:
        pytest.fail(str(error), pytrace=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
