"""Prometheus' own tools for the tests: `promtool check metrics` and a private Prometheus server on loopback.

Both come from Debian's `prometheus` package. Missing tools fail the test with how to install them; the
only way to skip is GPUFLEET_TEST_PROMETHEUS=0, which says so in the skip reason.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

OPT_OUT = "GPUFLEET_TEST_PROMETHEUS"


def require(tool: str) -> str:
    if os.environ.get(OPT_OUT) == "0":
        pytest.skip(f"{OPT_OUT}=0: the Prometheus checks were opted out; this test did not run")
    path = shutil.which(tool)
    if path is None:
        pytest.fail(
            f"`{tool}` is not installed; to fix: apt-get install -y --no-install-recommends prometheus "
            f"(Debian's package; CI installs it), or set {OPT_OUT}=0 to skip the Prometheus checks"
        )
    return path


def promtool_check(exposition: bytes) -> tuple[int, list[str]]:
    """Exit code and the problems `promtool check metrics` reports (one a line)."""
    done = subprocess.run(
        [require("promtool"), "check", "metrics"], input=exposition, capture_output=True, timeout=30, check=False
    )
    lines = (done.stdout + done.stderr).decode().splitlines()
    return done.returncode, [line for line in lines if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@contextmanager
def prometheus_server(
    target: str, workdir: Path, scrape_interval_s: float = 1.0, bearer: str | None = None, anonymous_too: bool = False
) -> Iterator[str]:
    """Run Prometheus scraping `target` (host:port); yields its base URL; stops it afterwards. With `bearer`,
    the scrape job `gpufleet` sends that token, read from a file only its owner reads, as the README's scrape
    config does (`authorization: {type: Bearer, credentials_file: …}`); `anonymous_too` adds a job
    `anonymous` that scrapes the same target without one."""
    binary = require("prometheus")
    config = workdir / "prometheus.yml"
    interval = f"{round(scrape_interval_s * 1000)}ms"  # Prometheus durations take no fractions
    auth = ""
    if bearer:
        secret = workdir / "gpufleet-metrics.token"
        secret.touch(mode=0o600)
        secret.write_text(bearer + "\n")  # Prometheus trims the trailing newline, as `echo > file` leaves one
        auth = f"    authorization:\n      type: Bearer\n      credentials_file: '{secret}'\n"
    text = (
        f"global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n"
        f"scrape_configs:\n  - job_name: gpufleet\n{auth}    static_configs:\n      - targets: ['{target}']\n"
    )
    if anonymous_too:
        text += f"  - job_name: anonymous\n    static_configs:\n      - targets: ['{target}']\n"
    config.write_text(text)
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"Prometheus exited: {(workdir / 'prometheus.log').read_text()[-2000:]}")
            return _ready(base)

        wait_for(ready, 20, f"Prometheus to start (log: {workdir / 'prometheus.log'})")
        yield base
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/-/ready", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def wait_for(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def query(base: str, expr: str) -> list[dict[str, Any]]:
    data = get_json(base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert data["status"] == "success", data
    return list(data["data"]["result"])
