"""`gpufleet jobs` folds each array into one line: the array's id, and its tasks counted by state (as squeue
shows `123_[5-99]`); `--expand` lists every task."""

from __future__ import annotations

from typing import Any

from gpufleet.client import Client

ORDER = ("running", "launching", "admitted", "evicting", "pending", "held", "succeeded", "failed", "cancelled")


def fold(client: Client, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`jobs` with the tasks of each array replaced by one row, where the array's first task on the page was."""
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for job in jobs:
        array_id = job.get("array_id")
        if not array_id:
            rows.append(job)
            continue
        if array_id in seen:
            continue
        seen.add(array_id)
        counts = client.get(f"/v1/arrays/{array_id}")
        states = counts["states"]
        said = " ".join(f"{s}:{states[s]}" for s in ORDER if s in states)
        rows.append({**job, "id": f"{array_id} [{counts['tasks']} tasks]", "state": said})
    return rows
