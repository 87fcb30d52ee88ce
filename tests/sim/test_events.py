"""Cluster events in the simulator (node failures and repairs, quota changes, nodes added), the seeded failure
model, and the what-if flags of `gpufleet sim`."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.domain import GPU, GiB, Job, QueueSpec, Quota, WorkerRequest, make_node
from gpufleet.domain.lifecycle import JobState
from gpufleet.policies.catalog import profile
from gpufleet.ports import Launch
from gpufleet.sim.engine import SimRun, SimSettings, Simulation
from gpufleet.sim.events import AddNodes, FailureModel, NodeDown, NodeUp, QuotaChange
from gpufleet.sim.experiment import run_experiment
from gpufleet.sim.simulated_backend import BackendSettings
from gpufleet.sim.whatif import add_nodes_spec, apply_what_if, quota_spec
from gpufleet.sim.workload import ThroughputEntry, ThroughputTable, TraceJob, Workload, WorkloadError
from gpufleet.sim.workloads import generate_synthetic

S = JobState


def _job(job_id: str, at: float, queue: str = "q", gpus: int = 1, seq: int = 0) -> Job:
    return Job(job_id, queue, WorkerRequest(gpus=gpus), submit_seq=seq, submitted_at=at)


def two_nodes(*events: object, queues: tuple[QueueSpec, ...] = (QueueSpec("q"),)) -> Workload:
    """Two nodes of 2 T4 each; four 1-GPU jobs of 1000 s arriving at 0, so each node runs two."""
    return Workload(
        name="two-nodes",
        citation="hand-made test workload",
        license="test",
        nodes=(make_node("n0", "T4", 2, 16 * GiB), make_node("n1", "T4", 2, 16 * GiB)),
        queues=queues,
        jobs=tuple(TraceJob(_job(f"j{i}", 0.0, seq=i), 1000.0) for i in range(4)),
        events=tuple(events),  # type: ignore[arg-type]
    )


class LaunchLog:
    """Wraps a simulation's backend to record every launch: (time, job, attempt, nodes)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.launches: list[tuple[float, str, int, frozenset[str]]] = []
        inner = sim.backend.launch

        def launch(launch: Launch) -> None:
            self.launches.append(
                (sim.clock.now(), launch.job.id, launch.attempt, frozenset(w.node for w in launch.workers))
            )
            inner(launch)

        sim.backend.launch = launch  # type: ignore[method-assign]


def run_logged(workload: Workload, policy: str = "fifo", sim_settings: SimSettings | None = None) -> tuple:
    sim = Simulation(workload, profile(policy), sim_settings)
    log = LaunchLog(sim)
    return sim.run(), log.launches


def down_intervals(run: SimRun) -> dict[str, list[tuple[float, float]]]:
    """Per node, the [down, up) intervals from the run's cluster log (open intervals end at infinity)."""
    out: dict[str, list[tuple[float, float]]] = {}
    since: dict[str, float] = {}
    for change in run.cluster_log:
        if change.kind == "down":
            since[change.target] = change.at
        elif change.kind == "up" and change.target in since:
            out.setdefault(change.target, []).append((since.pop(change.target), change.at))
    for node, at in since.items():
        out.setdefault(node, []).append((at, float("inf")))
    return out


def assert_never_placed_on_a_down_node(run: SimRun, launches: list) -> None:
    intervals = down_intervals(run)
    for at, job, attempt, nodes in launches:
        for node in nodes:
            for start, end in intervals.get(node, ()):
                assert not (start <= at < end), f"{job}#{attempt} launched on {node} at {at}, down {start}-{end}"


# --- node failures --------------------------------------------------------------------------------------


def test_a_node_failure_reruns_its_jobs_elsewhere_and_they_finish_later() -> None:
    baseline, _ = run_logged(two_nodes())
    on_n0 = {r.id for r in baseline.store.all() if r.workers[0].node == "n0"}
    assert len(on_n0) == 2
    base_finish = {r.id: r.finished_at for r in baseline.store.all()}
    assert set(base_finish.values()) == {1000.0}

    run, launches = run_logged(two_nodes(NodeDown(400.0, "n0", "power supply")))
    records = {r.id: r for r in run.store.all()}
    assert all(r.state is S.SUCCEEDED for r in records.values())
    for job_id in on_n0:
        r = records[job_id]
        # Lost at 400 s with no checkpoint: waits for n1 (busy until 1000 s), reruns 1000 s + 30 s restart.
        assert r.attempt == 2
        assert r.workers[0].node == "n1"
        assert r.finished_at is not None
        assert r.finished_at > base_finish[job_id]
        assert r.finished_at == pytest.approx(2030.0)
        reasons = [t.reason for t in run.store.history(job_id)]
        assert any("node n0 failed: power supply" in reason for reason in reasons)
    for job_id in set(records) - on_n0:
        assert records[job_id].finished_at == 1000.0
        assert records[job_id].attempt == 1
    stats = run.stats
    assert (stats.node_failures, stats.jobs_lost_to_failures) == (1, 2)
    assert stats.failure_lost_work_seconds == pytest.approx(800.0)
    assert stats.failure_lost_gpu_seconds == pytest.approx(800.0)
    assert run.node_down_gpu_seconds == pytest.approx(2 * (run.end_time - 400.0))
    assert_never_placed_on_a_down_node(run, launches)
    metrics = run_experiment(two_nodes(NodeDown(400.0, "n0")), ["fifo"]).results[0].metrics.as_dict()
    assert metrics["node_failures"] == 1
    assert metrics["jobs_lost_to_failures"] == 2
    assert metrics["failure_lost_gpu_hours"] == pytest.approx(800.0 / 3600.0)
    assert metrics["lost_gpu_hours"] == pytest.approx(800.0 / 3600.0)  # the total covers failures too


def test_periodic_checkpoints_limit_what_a_failure_loses() -> None:
    sim_settings = SimSettings(backend=BackendSettings(checkpoint_every_s=300.0))
    run, _ = run_logged(two_nodes(NodeDown(400.0, "n0"), NodeUp(500.0, "n0")), sim_settings=sim_settings)
    # Each lost job had a checkpoint at 300 s: it loses 100 s, and reruns the remaining 700 s (+ 30 s restart)
    # once n0 is back at 500 s.
    assert run.stats.failure_lost_work_seconds == pytest.approx(200.0)
    finished = sorted(r.finished_at for r in run.store.all())
    assert finished == pytest.approx([1000.0, 1000.0, 1230.0, 1230.0])


def test_a_repaired_node_takes_work_again() -> None:
    run, launches = run_logged(two_nodes(NodeDown(400.0, "n0"), NodeUp(600.0, "n0")))
    relaunched = [(at, nodes) for at, _, attempt, nodes in launches if attempt == 2]
    assert relaunched == [(600.0, frozenset({"n0"})), (600.0, frozenset({"n0"}))]
    assert [c.kind for c in run.cluster_log] == ["down", "up"]
    assert run.node_down_gpu_seconds == pytest.approx(2 * 200.0)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), mtbf=st.sampled_from([5.0, 20.0, 100.0]))
def test_no_job_is_ever_placed_on_a_down_node(seed: int, mtbf: float) -> None:
    workload = generate_synthetic(seed=seed % 7, jobs=50, nodes=4, arrival_rate_per_hour=120.0)
    down = NodeDown(1800.0, workload.nodes[0].name)
    workload = replace(workload, events=(down,))
    sim_settings = SimSettings(
        backend=BackendSettings(checkpoint_every_s=600.0), failures=FailureModel(mtbf, 1.0, seed)
    )
    run, launches = run_logged(workload, "default", sim_settings)
    assert run.stats.node_failures >= 1
    assert_never_placed_on_a_down_node(run, launches)
    lost = {
        line.split("#")[0] for c in run.cluster_log if c.kind == "down" for line in c.detail.split(": ")[-1].split(", ")
    }
    records = {r.id: r for r in run.store.all()}
    # Every job lost to a failure was retried: it finished, or waits or runs again at the end.
    for job_id in lost - {"none"}:
        assert records[job_id].attempt >= 2 or records[job_id].state is S.PENDING


def test_failure_model_runs_are_byte_identical() -> None:
    workload = generate_synthetic(seed=2, jobs=100, nodes=6)
    model = FailureModel(mtbf_hours=20.0, repair_hours=2.0, seed=11)

    def serialised(failures: FailureModel) -> bytes:
        run = Simulation(workload, profile("default"), SimSettings(failures=failures)).run()
        log = [asdict(t) for t in run.store.log]
        return json.dumps({"log": log, "cluster": [c.as_dict() for c in run.cluster_log]}).encode()

    first = serialised(model)
    assert first == serialised(model)
    assert b'"kind": "down"' in first
    assert b'"kind": "up"' in first
    assert first != serialised(replace(model, seed=12))


def test_failures_of_a_node_do_not_depend_on_the_rest_of_the_cluster() -> None:
    model = FailureModel(mtbf_hours=5.0, repair_hours=1.0, seed=3)
    clock_a, clock_b = model.clock("syn-0001"), model.clock("syn-0001")
    assert [clock_a.next_failure(0.0) for _ in range(3)] == [clock_b.next_failure(0.0) for _ in range(3)]
    assert model.clock("syn-0002").next_failure(0.0) != model.clock("syn-0001").next_failure(0.0)


def test_failures_alone_do_not_keep_a_finished_run_going() -> None:
    run, _ = run_logged(two_nodes(), sim_settings=SimSettings(failures=FailureModel(1000.0, 1.0, 0)))
    assert run.end_time == 1000.0  # all jobs finished; the failures drawn for later never happen


def test_failure_model_needs_positive_hours() -> None:
    with pytest.raises(WorkloadError, match="mtbf_hours"):
        FailureModel(0.0, 1.0)
    with pytest.raises(WorkloadError, match="repair_hours"):
        FailureModel(10.0, float("nan"))


# --- quota changes and added nodes --------------------------------------------------------------------


def test_a_quota_change_lets_a_queue_grow_at_that_time_and_not_before() -> None:
    small = QueueSpec("q", {GPU: Quota(1000, borrowing_limit=0)})
    big = QueueSpec("q", {GPU: Quota(4000, borrowing_limit=0)})
    before, _ = run_logged(two_nodes(queues=(small,)))
    starts = sorted(r.first_started_at for r in before.store.all())
    assert starts == [0.0, 1000.0, 2000.0, 3000.0]  # one GPU of quota: one job at a time

    run, _ = run_logged(two_nodes(QuotaChange(250.0, big), queues=(small,)))
    starts = sorted(r.first_started_at for r in run.store.all())
    assert starts == [0.0, 250.0, 250.0, 250.0]
    assert [c.kind for c in run.cluster_log] == ["quota"]


def test_nodes_added_during_the_run_take_waiting_jobs() -> None:
    one = Workload(
        name="one-node",
        citation="hand-made test workload",
        license="test",
        nodes=(make_node("n0", "T4", 1, 16 * GiB),),
        queues=(QueueSpec("q"),),
        jobs=tuple(TraceJob(_job(f"j{i}", 0.0, seq=i), 100.0) for i in range(3)),
        events=(AddNodes(50.0, (make_node("n9", "L4", 2, 24 * GiB),)),),
    )
    run, launches = run_logged(one)
    assert sorted(r.first_started_at for r in run.store.all()) == [0.0, 50.0, 50.0]
    assert {node for at, _, _, nodes in launches if at == 50.0 for node in nodes} == {"n9"}
    result = run_experiment(one, ["fifo"]).results[0]
    assert result.recording.models == ("L4", "T4")  # a model that joined mid-run gets its own column
    assert result.metrics.gpu_hours_by_model["L4"] == pytest.approx(200.0 / 3600.0)
    assert 0.0 < result.metrics.gpu_alloc_pct <= 100.0


@pytest.mark.parametrize(
    ("event", "match"),
    [
        (NodeDown(10.0, "nowhere"), "does not have"),
        (NodeUp(-1.0, "n0"), "at time -1"),
        (QuotaChange(10.0, QueueSpec("ghost")), "queue 'ghost'"),
        (AddNodes(10.0, (make_node("n0", "T4", 1, 16 * GiB),)), "already exists"),
    ],
)
def test_workload_events_are_validated(event: object, match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        two_nodes(event)


# --- what-if parsing ------------------------------------------------------------------------------------


def test_add_nodes_spec_builds_named_nodes_of_the_workloads_model() -> None:
    workload = generate_synthetic(seed=0, jobs=10, nodes=4)
    added = add_nodes_spec("8xH100@3", workload)
    assert [n.name for n in added.nodes] == ["added-h100-000", "added-h100-001", "added-h100-002"]
    assert {g.model for n in added.nodes for g in n.gpus} == {"H100-80GB"}  # the workload's own H100 model
    shape = workload.nodes[0]  # 8 GPUs: added nodes get the same CPU and memory per GPU
    assert all(len(n.gpus) == 8 and (n.cpu_milli, n.memory) == (shape.cpu_milli, shape.memory) for n in added.nodes)
    mixed = add_nodes_spec("2xL4,2xT4", workload).nodes[0]
    assert [g.model for g in mixed.gpus] == ["L4", "L4", "T4", "T4"]


def test_quota_spec_keeps_what_it_does_not_name() -> None:
    queues = {"a": QueueSpec("a", {GPU: Quota(8000, borrowing_limit=2000)}, cohort="c", weight=2.0)}
    spec = quota_spec("a:gpu=16", queues, {"T4"})
    assert spec.quotas[GPU] == Quota(16000, 2000)
    assert spec.cohort == "c"
    assert spec.weight == 2.0
    spec = quota_spec("a:gpu=4,borrowing=1,gpu:T4=2,weight=3", queues, {"T4"})
    assert spec.quotas[GPU] == Quota(4000, 1000)
    assert spec.quotas["gpu:T4"] == Quota(2000)
    assert spec.weight == 3.0
    assert GPU not in quota_spec("a:gpu=unlimited", queues, {"T4"}).quotas


def test_apply_what_if_orders_timed_quota_events() -> None:
    workload = generate_synthetic(seed=0, jobs=10, nodes=4)
    changed = apply_what_if(
        workload,
        quotas=["team-a:gpu=4"],
        events=["2h:quota:team-a:borrowing=1", "1h:quota:team-a:gpu=10", "30m:down:syn-0001", "45m:up:syn-0001"],
    )
    quota_events = [e for e in changed.workload.events if isinstance(e, QuotaChange)]
    # The 1 h event applies first; the 2 h one starts from it (gpu=10) and adds the borrowing limit.
    assert [(e.at, e.queue.quotas[GPU]) for e in quota_events] == [
        (3600.0, Quota(10000, None)),
        (7200.0, Quota(10000, 1000)),
    ]
    assert {q.name: q for q in changed.workload.queues}["team-a"].quotas[GPU].nominal == 4000
    assert len(changed.changes) == 5


# --- the CLI --------------------------------------------------------------------------------------------

OVERLOADED = ["--set", "jobs=80", "--set", "nodes=4", "--set", "arrival_rate_per_hour=240", "-p", "fifo", "--json"]


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.delenv("GPUFLEET_TRACES", raising=False)
    monkeypatch.delenv("GPUFLEET_PRICES", raising=False)
    return CliRunner()


def _sim_json(runner: CliRunner, *args: str) -> dict:
    result = runner.invoke(app, ["sim", *OVERLOADED, *args])
    assert result.exit_code == 0, result.output
    data: dict = json.loads(result.stdout)
    return data


def test_add_nodes_cuts_queueing_on_an_overloaded_workload(runner: CliRunner) -> None:
    before = _sim_json(runner)
    after = _sim_json(runner, "--add-nodes", "8xH100@4", "--grow-quotas")
    assert after["workload"]["gpus"] == before["workload"]["gpus"] + 32
    wait_before = before["policies"]["fifo"]["avg_queueing_s"]
    wait_after = after["policies"]["fifo"]["avg_queueing_s"]
    assert wait_after < 0.7 * wait_before
    assert after["what_if"][0].startswith("--add-nodes 8xH100@4: 4 node(s) with 32 GPUs (H100-80GB)")
    assert after["what_if"][1].startswith("--grow-quotas")
    # Without growing the quotas the tool says that they cap what the new GPUs can do.
    capped = _sim_json(runner, "--add-nodes", "8xH100@2")
    assert any("quotas total" in line for line in capped["what_if"])


def test_failures_and_events_show_in_json_table_and_report(runner: CliRunner, tmp_path: object) -> None:
    flags = ["--node-mtbf-hours", "5", "--repair-hours", "1", "--event", "1800:down:syn-0000"]
    data = _sim_json(runner, *flags, "--seed", "1")
    m = data["policies"]["fifo"]
    assert m["node_failures"] >= 1
    assert m["cluster_events"] >= 1
    for key in ("jobs_lost_to_failures", "failure_lost_work_s", "failure_lost_gpu_hours", "node_down_gpu_hours"):
        assert key in m
    assert any(line.startswith("--node-mtbf-hours 5:") for line in data["what_if"])
    table = runner.invoke(app, ["sim", *OVERLOADED[:-1], *flags, "--out", str(tmp_path)])
    assert table.exit_code == 0, table.output
    assert "node fail" in table.stdout
    assert "what-if: --event 1800:down:syn-0000" in table.stdout
    report = (tmp_path / "report.md").read_text()  # type: ignore[operator]
    assert "### What-if changes" in report
    assert "node failures" in report
    results = json.loads((tmp_path / "results.json").read_text())  # type: ignore[operator]
    assert results["what_if"]
    assert "node_failures" in results["policies"]["fifo"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--add-nodes", "8xH100@0"], "node count after @"),
        (["--add-nodes", "8xWARP9"], "WARP9"),
        (["--add-nodes", "zero"], "--add-nodes 'zero'"),
        (["--quota", "team-z:gpu=4"], "no queue 'team-z'; to fix: name one of its queues: team-a, team-b, team-c"),
        (["--quota", "team-a"], "is not QUEUE:KEY=VALUE"),
        (["--quota", "team-a:gpu=-3"], "gpu is '-3'"),
        (["--quota", "team-a:colour=blue"], "'colour' is not a quota key"),
        (["--quota", "team-a:gpu:B200=4"], "no GPU model 'B200'"),
        (["--node-mtbf-hours", "0"], "--node-mtbf-hours is 0"),
        (["--node-mtbf-hours", "10", "--repair-hours", "-1"], "--repair-hours is -1"),
        (["--repair-hours", "3"], "--repair-hours needs --node-mtbf-hours"),
        (["--event", "soon:down:syn-0000"], "the time 'soon'"),
        (["--event", "3600:down:node-99"], "no node 'node-99'"),
        (["--event", "3600:explode:syn-0000"], "'explode' is not an event kind"),
        (["--event", "3600:quota:team-q:gpu=1"], "no queue 'team-q'"),
        (["--event", "3600"], "is not TIME:KIND:WHAT"),
        (["--grow-quotas"], "--grow-quotas grows quotas"),
        (["--checkpoint-every-s", "0"], "--checkpoint-every-s is 0"),
        (["--reproduce", "fgd", "--add-nodes", "8xH100"], "drop --add-nodes"),
    ],
)
def test_bad_what_if_flags_are_clear_errors(runner: CliRunner, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["sim", "--set", "jobs=5", "--set", "nodes=4", *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stderr.startswith("error: ")
    assert message in result.stderr
    assert "to fix:" in result.stderr


def test_added_gpus_need_a_throughput_measurement_when_the_workload_has_a_table() -> None:
    table = ThroughputTable((ThroughputEntry("resnet", "V100", 1, 10.0),), source="test table", reference="V100")
    workload = replace(two_nodes(), throughput=table)
    with pytest.raises(WorkloadError, match="no measurements for H100"):
        add_nodes_spec("8xH100", workload)
    assert add_nodes_spec("4xV100", workload).nodes[0].gpus[0].model == "V100"
    with pytest.raises(WorkloadError, match="throughput table lacks"):
        replace(workload, events=(AddNodes(5.0, (make_node("h", "H100", 8, 80 * GiB),)),))
