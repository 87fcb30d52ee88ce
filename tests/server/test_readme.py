"""The README's example job spec is a valid spec: the first thing a new user submits must not fail."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpufleet.server.spec import JobSpec

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_job_spec_is_accepted_and_means_what_it_says() -> None:
    block = re.search(r"<<'YAML'\n(.*?)\nYAML\n", README.read_text(), re.S)
    assert block is not None, "the README lost its example job spec"
    spec = JobSpec.model_validate(yaml.safe_load(block.group(1)))
    job = spec.to_job("j-00000001", "default")
    assert job.request.gpus == 2
    assert job.request.models == frozenset({"A100-80GB", "H100"})
    assert job.run is not None
    assert job.run.command == ("python", "train.py", "--epochs", "10")
    assert job.run.grace_s == 30.0
    assert job.run.max_runtime_s == 12 * 3600
    assert job.run.retries == 1
