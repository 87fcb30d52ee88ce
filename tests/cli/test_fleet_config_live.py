"""`gpufleet apply -f` and `gpufleet export` through the CLI (a child process) against a real `gpufleet up`: a
fleet's queues, quotas, cohorts, budgets, prices and token bindings from one file, all or nothing, idempotent,
with a dry run, `--prune`, and an export that applies back as a no-op."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml

from tests.cli.conftest import Cli

pytestmark = pytest.mark.slow

FLEET = """
queues:
  cfg-a:
    cohort: research
    weight: 2
    quotas: {gpu: 4, "gpu:A100-80GB": {nominal: 2, borrowing_limit: 2}, memory: 512GiB}
    budget: {amount: 100, unit: gpu-hours, period: month, action: warn}
  cfg-b:
    cohort: research
    quotas: {gpu: 2}
prices:
  - {model: A100-80GB, pool: on-demand, usd_per_gpu_hour: 3.5, source: our contract}
tokens:
  - {name: cfg-alice, role: team, queue: cfg-a}
"""


def _export(cli: Cli) -> dict:
    done = cli("export")
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def _secret(out: str, name: str) -> str:
    line = next(line for line in out.splitlines() if line.startswith(f"token {name}: secret "))
    return line.split("secret ")[1].split()[0]


def _list(cli: Cli, secret: str, queue: str | None) -> int:
    params = {"queue": queue} if queue else {}
    answer = httpx.get(f"{cli.live.url}/v1/jobs", params=params, headers={"Authorization": f"Bearer {secret}"})
    return answer.status_code


def _apply(cli: Cli, text: str, *flags: str) -> tuple[int, str, str]:
    done = cli("apply", "-f", "-", *flags, stdin=text)
    return done.returncode, done.stdout, done.stderr


def test_apply_makes_the_fleet_match_and_a_second_apply_changes_nothing(cli: Cli) -> None:
    before = _export(cli)
    code, out, err = _apply(cli, FLEET, "--dry-run")
    assert code == 0, err
    assert "queue cfg-a would create" in out
    assert "budget cfg-a would create" in out
    assert "price A100-80GB (on-demand) would create" in out
    assert "token cfg-alice would create" in out
    assert _export(cli) == before  # a dry run changes nothing

    code, out, err = _apply(cli, FLEET)
    assert code == 0, err
    assert "queue cfg-a created" in out
    assert "  weight: - → 2" in out
    secret = _secret(out, "cfg-alice")
    after = _export(cli)
    assert after["queues"]["cfg-a"]["cohort"] == "research"
    assert after["queues"]["cfg-a"]["quotas"] == {
        "gpu": 4, "gpu:A100-80GB": {"nominal": 2, "borrowing_limit": 2}, "memory": "512GiB",
    }  # fmt: skip
    assert after["queues"]["cfg-a"]["budget"]["unit"] == "gpu-hours"
    assert {"model": "A100-80GB", "pool": "on-demand", "usd_per_gpu_hour": 3.5, "source": "our contract"} in after[
        "prices"
    ]
    # The token made is a working team token of its queue.
    assert _list(cli, secret, "cfg-a") == 200
    assert _list(cli, secret, "cfg-b") == 403

    code, out, err = _apply(cli, FLEET)
    assert code == 0, err
    assert "nothing to change" in out
    assert "secret" not in out  # no second token


def test_export_applies_back_as_a_no_op(cli: Cli) -> None:
    _apply(cli, FLEET)
    exported = cli("export").stdout
    assert exported.startswith("# gpufleet fleet config")
    code, out, err = _apply(cli, exported, "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["changes"] == []
    assert answer["unchanged"] >= 4


def test_one_bad_entry_refuses_the_whole_file_and_changes_nothing(cli: Cli) -> None:
    before = _export(cli)
    bad = """
queues:
  cfg-new: {quotas: {gpu: 1}}
  cfg-bad: {quotas: {gpux: 1}, weight: 2}
prices:
  - {model: H100, usd_per_gpu_hour: 2}
  - {model: H100, usd_per_gpu_hour: 3}
tokens:
  - {name: cfg-nobody, role: team, queue: no-such-queue}
"""
    code, out, err = _apply(cli, bad)
    assert code == 2
    assert "queues.cfg-bad.quotas.gpux" in err
    assert "prices[1]" in err
    assert "listed twice" in err
    assert "tokens[0].queue" in err
    assert "no-such-queue" in err
    assert _export(cli) == before
    code, _, err = _apply(cli, "queues: [a, b]\n")
    assert code == 2
    assert "queues" in err
    code, _, err = _apply(cli, "queues:\n  x: {quotas: {gpu: 1}\n")
    assert code == 2
    assert "not valid YAML" in err
    assert "line" in err


def test_a_token_bound_to_another_queue_is_replaced_and_its_old_secret_stops(cli: Cli) -> None:
    code, out, err = _apply(cli, FLEET)
    assert code == 0, err
    first = cli("apply", "-f", "-", stdin=FLEET.replace("cfg-alice", "cfg-bob"))
    old_secret = _secret(first.stdout, "cfg-bob")
    moved = FLEET.replace("cfg-alice", "cfg-bob").replace("queue: cfg-a}", "queue: cfg-b}")
    code, out, err = _apply(cli, moved)
    assert code == 0, err
    assert "token cfg-bob changed" in out
    assert "  queue: cfg-a → cfg-b" in out
    assert _list(cli, old_secret, None) == 401


def test_prune_removes_what_the_file_leaves_out_but_never_a_queue_with_active_jobs(cli: Cli) -> None:
    _apply(cli, FLEET)
    extra = FLEET + "  - {name: cfg-carol, role: team, queue: cfg-b}\n"
    assert _apply(cli, extra)[0] == 0
    whole = _export(cli)
    # A file without cfg-b: --prune would delete it, yet a token is bound to it.
    without_b = {**whole, "queues": {k: v for k, v in whole["queues"].items() if k != "cfg-b"}}
    without_b["tokens"] = [t for t in whole["tokens"] if t.get("queue") != "cfg-b"]
    code, _, err = _apply(cli, yaml.safe_dump(without_b), "--prune")
    assert code == 2
    assert "queues.cfg-b" in err
    assert "cfg-carol" in err
    assert _export(cli) == whole
    # Without --prune, leaving it out leaves it alone.
    code, out, err = _apply(cli, yaml.safe_dump(without_b))
    assert code == 0, err
    assert "nothing to change" in out
    # A price the file leaves out goes with --prune.
    no_prices = {**whole, "prices": []}
    code, out, err = _apply(cli, yaml.safe_dump(no_prices), "--prune", "--dry-run")
    assert code == 0, err
    assert "price A100-80GB (on-demand) would delete" in out
    assert "queue " not in out


def test_a_team_token_may_neither_apply_nor_export(cli: Cli) -> None:
    code, out, err = _apply(cli, FLEET)
    assert code == 0, err
    made = cli("apply", "-f", "-", stdin=FLEET.replace("cfg-alice", "cfg-dave"))
    secret = _secret(made.stdout, "cfg-dave")
    refused = cli("export", token=secret)
    assert refused.returncode == 2
    assert "admin" in refused.stderr
    refused = cli("apply", "-f", "-", stdin=FLEET, token=secret)
    assert refused.returncode == 2
    assert "admin" in refused.stderr


def test_the_sdk_applies_and_reads_the_same_config(cli: Cli) -> None:
    from gpufleet import Client
    from gpufleet.domain.errors import SpecError

    config = yaml.safe_load(FLEET.replace("cfg-", "sdk-"))
    with Client(cli.live.url, cli.live.server.token) as fleet:
        planned = fleet.apply_config(config, dry_run=True)
        assert not planned.applied
        assert ("queue", "sdk-a", "create") in {(c.kind, c.name, c.action) for c in planned.changes}
        done = fleet.apply_config(config)
        assert done.applied
        assert set(done.secrets) == {"sdk-alice"}
        assert fleet.apply_config(config).changes == ()
        assert fleet.fleet_config()["queues"]["sdk-a"]["weight"] == 2
        with pytest.raises(SpecError) as refused:
            fleet.apply_config({"queues": {"sdk-c": {"quotas": {"gpux": 1}}}})
        assert any(f.field == "queues.sdk-c.quotas.gpux" for f in refused.value.fields)
