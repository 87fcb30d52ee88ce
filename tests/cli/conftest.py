"""A real `gpufleet up` (local executor, one emulated node of 8 A100-80GB) shared by a module's tests, and the CLI
run as a user runs it: a child process whose stdout is a pipe, not a terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.server.live import Live, start


@dataclass
class Cli:
    live: Live

    def __call__(
        self, *args: str, stdin: str | None = None, token: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`gpufleet ARGS…` against the live control plane; stdout and stderr are pipes."""
        full = {
            **os.environ,
            "GPUFLEET_URL": self.live.url,
            "GPUFLEET_TOKEN": token or self.live.server.token,
            "GPUFLEET_CLIENT_CONFIG": str(self.live.root / "client.toml"),
            "COLUMNS": "80",
            **(env or {}),
        }
        done = subprocess.run(
            [sys.executable, "-m", "gpufleet", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=full,
            timeout=120,
            check=False,
        )
        assert "Traceback" not in done.stderr, done.stderr
        return done

    def job(self, job_id: str) -> dict[str, Any]:
        """The job as the API shows it now."""
        with self.live.http() as client:
            return self.live.job(client, job_id)

    def until(self, job_id: str, check: Callable[[dict[str, Any]], bool], timeout_s: float = 30.0) -> dict[str, Any]:
        """The job once `check` holds for it (an error after `timeout_s`)."""
        with self.live.http() as client:
            return self.live.wait(client, job_id, check, timeout_s)


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    live = start(tmp_path_factory.mktemp("cli-live"))
    try:
        yield Cli(live)
    finally:
        live.server.stop()
