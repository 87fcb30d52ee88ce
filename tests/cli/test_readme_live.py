"""The README's SDK example and fleet config, run as written against a real `gpufleet up` (local executor)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli.conftest import Cli

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"


def _block(start: str, language: str) -> str:
    found = re.search(rf"```{language}\n({re.escape(start)}.*?)```", README.read_text(), re.S)
    assert found is not None, f"the README lost its {language} block that starts with {start!r}"
    return found.group(1)


def test_the_readme_sdk_example_runs_and_prints_what_its_comments_say(cli: Cli) -> None:
    code = _block("from gpufleet import Client", "python")
    env = {**os.environ, "GPUFLEET_URL": cli.live.url, "GPUFLEET_TOKEN": cli.live.server.token}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False, cwd="/"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "42"
    job_id, state, status = lines[1].split()
    assert (job_id[:2], state, status) == ("j-", "succeeded", "0")
    assert lines[2] == "{'succeeded': 4}"
    assert lines[3] == "task 3"


def test_the_readme_fleet_config_applies_once_and_then_changes_nothing(cli: Cli) -> None:
    text = _block("queues:", "yaml")
    config = yaml.safe_load(text)
    assert set(config) == {"queues", "prices", "tokens"}
    first = cli("apply", "-f", "-", stdin=text)
    assert first.returncode == 0, first.stderr
    assert "queue research created" in first.stdout
    assert "token research-ci: secret " in first.stdout
    again = cli("apply", "-f", "-", stdin=text)
    assert again.returncode == 0, again.stderr
    assert "nothing to change" in again.stdout
    exported = yaml.safe_load(cli("export").stdout)
    assert exported["queues"]["research"]["quotas"] == config["queues"]["research"]["quotas"]
    assert exported["queues"]["research"]["budget"]["action"] == "deprioritise"
    assert exported["queues"]["prod"]["max_grace"] == 7200
