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


def test_the_readme_limits_are_the_ones_the_api_enforces() -> None:
    from gpufleet.server import limits
    from gpufleet.server.ratelimit import ADMIN_RATE, TEAM_RATE

    text = README.read_text()
    table = text[text.index("| what | at most |") : text.index("Booleans are not numbers")]
    for value in (limits.MAX_GPUS_PER_WORKER, limits.MAX_CPU_PER_WORKER, limits.MAX_WORKERS, limits.MAX_ARGUMENTS,
                  limits.MAX_ENV_VARS, limits.MAX_QUOTA_GPUS, limits.MAX_QUOTA_CPU):  # fmt: skip
        assert f"{value:,}" in table, value
    sized = [
        (limits.MAX_BYTES_PER_WORKER, 1 << 50, "1 PiB"),
        (limits.MAX_QUOTA_BYTES, 1 << 60, "1 EiB"),
        (limits.MAX_ARGUMENT, 128 * 1024, "128 KiB each"),
        (limits.MAX_COMMAND, 256 * 1024, "256 KiB in all"),
        (limits.MAX_ENV_VALUE, 32 * 1024, "32 KiB each"),
        (limits.MAX_BODY_BYTES, 1 << 20, "1 MiB"),
        (limits.DEFAULT_MAX_GRACE_S, 3600, "maximum (1h)"),
        (limits.MAX_DURATION_S, 366 * 86400, "366 days"),
    ]
    assert [(value, words in table) for value, _, words in sized] == [(value, True) for _, value, _ in sized]
    rates = f"{TEAM_RATE.per_s:g} requests a second on average, bursts of {TEAM_RATE.burst:g}"
    assert rates in text.replace("\n", " ")
    assert f"admin tokens {ADMIN_RATE.per_s:,.0f} and {ADMIN_RATE.burst:,.0f}" in text.replace("\n", " ")


def test_the_readme_inventory_example_is_read_as_it_says(tmp_path: Path) -> None:
    from gpufleet.adapters.inventory.emulated_inventory import load_inventory_yaml

    block = re.search(r"```yaml\n(nodes:\n.*?)```", README.read_text(), re.S)
    assert block is not None, "the README lost its inventory example"
    file = tmp_path / "fleet.yaml"
    file.write_text(block.group(1))
    a, b = load_inventory_yaml(file)
    assert (a.name, len(a.gpus), a.gpus[0].model, a.rack, a.zone, a.pool) == (
        "gpu-a",
        8,
        "A100-80GB",
        "r1",
        "z1",
        "spot",
    )
    assert a.memory == 512 << 30
    assert (b.name, sorted(g.model for g in b.gpus)) == ("gpu-b", ["L4"] * 4 + ["T4"] * 2)


def test_the_readme_set_example_builds_the_spec_it_shows() -> None:
    from gpufleet.cli.spec_args import apply_sets

    line = next(x for x in README.read_text().splitlines() if "submit --set command=" in x)
    sets = re.findall(r"--set (\S+?=(?:'[^']*'|\S+))", line)
    spec = apply_sets({}, [s.replace("'", "") for s in sets])
    assert spec == {"command": ["python3", "eval.py"], "gpus": 1, "env": {"SEED": 7}}


def test_every_policy_the_readme_names_builds() -> None:
    from gpufleet.policies.catalog import profile

    named = set(re.findall(r"--policy ([\w.+=-]+)", README.read_text()))
    assert "fifo-backfill+reserve=2h" in named
    for name in sorted(named):
        built = profile(name)
        assert built.name == name
    assert profile("fifo-backfill+reserve=2h").reserve_after_s == 7200.0
