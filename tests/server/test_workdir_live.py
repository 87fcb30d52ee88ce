"""`gpufleet submit` runs the job in the folder it was called from (the README's `python train.py`)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.kit.jobusers import python_for_anyone, reachable_by_jobs, shared_ledger
from tests.kit.submit_here import submit_from
from tests.server.live import start


def test_a_relative_command_runs_in_the_folder_submit_was_called_from(tmp_path: Path) -> None:
    live = start(tmp_path)
    try:
        project = reachable_by_jobs(tmp_path / "project")
        out = shared_ledger(project / "out.jsonl")
        python, env = python_for_anyone()
        printed = submit_from(project, live.url, live.server.token, python, env, out)
        assert "succeeded" in printed
        assert [json.loads(line)["cwd"] for line in out.read_text().splitlines()] == [str(project)]
    finally:
        live.server.stop()
