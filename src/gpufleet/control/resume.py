"""What the control loop asks of the backend again when it starts, after `adopt`.

The loop writes an intent before it asks the backend (a stop as EVICTING, a resize as `resizing`), so a
control plane that died between the two leaves intents the backend may never have heard of. Both asks are
idempotent on every backend, so each is made again at start whether or not it was heard: a stop already
under way keeps its deadline, a resize already taken goes on (or has ended, and RESIZED is said again).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.records import JobRecord
from gpufleet.ports import ExecutionBackend, Launch


def resume_intents(
    backend: ExecutionBackend,
    holding: Sequence[JobRecord],
    launch_of: Callable[[JobRecord], Launch],
    grace_of: Callable[[JobRecord], float],
) -> None:
    """Ask `backend` again for every stop (EVICTING) and every resize (RUNNING and `resizing`) the store says
    is under way among the jobs `holding` resources, with the grace and launch the loop gives them."""
    for record in holding:
        if record.state is JobState.EVICTING:
            backend.stop(record.id, record.attempt, grace_of(record), record.reason)
        elif record.state is JobState.RUNNING and record.resizing and backend.capabilities.resize:
            # A shrink keeps `resize_to`; a grow holds its target as its workers.
            target = record.resize_to or record.workers
            backend.resize(dataclasses.replace(launch_of(record), workers=target), grace_of(record), record.resizes)
