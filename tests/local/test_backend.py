"""The local executor with real processes: environment, ports, exit codes, gangs, stops, logs, idempotency."""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import time
from pathlib import Path

from gpufleet.adapters.local.executor import LocalBackend
from gpufleet.adapters.local.proc import read_json
from gpufleet.domain import GiB, GpuShare, WorkerPlacement, WorkerRequest
from gpufleet.domain.jobs import RunSpec
from gpufleet.ports import Launch, ObservationKind
from tests.local.conftest import Harness, ended, has, only, pid_alive, wait_for, wait_until

K = ObservationKind


def read_envs(folder: Path, workers: int) -> list[dict[str, str]]:
    wait_until(lambda: all((folder / f"env-{r}.json").exists() for r in range(workers)), what="env files")
    return [json.loads((folder / f"env-{r}.json").read_text()) for r in range(workers)]


def test_each_worker_gets_its_gpus_ranks_and_rendezvous(harness: Harness, monkeypatch) -> None:
    monkeypatch.setenv("FROM_CONTROL_PLANE", "inherited")
    out = harness.root / "out"
    out.mkdir()
    backend = harness.backend()
    run = harness.run("env", str(out), env=(("USER_VAR", "1"), ("CUDA_VISIBLE_DEVICES", "0,1,2,3")))
    launch = harness.launch("train", run, gpus=((3, 1), (4, 5)), name="resnet")
    backend.launch(launch)
    seen = wait_for(backend, ended("train"))
    assert only(seen, "train", K.EXITED).exit_code == 0
    first, second = (r["env"] for r in read_envs(out, 2))
    uuids = [g.uuid for g in harness.node.gpus]
    # Placement order is kept, and the job's own CUDA_VISIBLE_DEVICES does not override the allocator's.
    assert first["CUDA_VISIBLE_DEVICES"] == f"{uuids[3]},{uuids[1]}"
    assert second["CUDA_VISIBLE_DEVICES"] == f"{uuids[4]},{uuids[5]}"
    assert first["NVIDIA_VISIBLE_DEVICES"] == first["CUDA_VISIBLE_DEVICES"]
    assert first["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert (first["GPUFLEET_GPU_INDICES"], second["GPUFLEET_GPU_INDICES"]) == ("3,1", "4,5")
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for e in (first, second)] == [
        ("0", "0", "2", "2"),
        ("1", "1", "2", "2"),
    ]
    assert first["NODE_RANK"] == second["NODE_RANK"] == "0"
    assert first["MASTER_ADDR"] == "127.0.0.1"
    assert first["MASTER_PORT"] == second["MASTER_PORT"]
    assert 29500 <= int(first["MASTER_PORT"]) <= 30499
    for env in (first, second):
        assert env["GPUFLEET_JOB_ID"] == "train"
        assert env["GPUFLEET_JOB_NAME"] == "resnet"
        assert env["GPUFLEET_QUEUE"] == "team-a"
        assert env["GPUFLEET_ATTEMPT"] == "1"
        assert env["GPUFLEET_EMULATED"] == "1"
        assert env["USER_VAR"] == "1"
        # Nothing of the control plane's own environment reaches a job: it may hold the operator's secrets.
        assert "FROM_CONTROL_PLANE" not in env
        assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        assert env["LANG"] == "C.UTF-8"
        assert env["USER"] == env["LOGNAME"] == pwd.getpwuid(os.geteuid()).pw_name
        assert env["HOME"] == pwd.getpwuid(os.geteuid()).pw_dir
        assert "GPUFLEET_GPU_FRACTION" not in env


def test_default_workdir_is_the_job_folder_and_a_relative_one_is_inside_it(harness: Harness) -> None:
    out = harness.root / "out"
    out.mkdir()
    backend = harness.backend()
    backend.launch(harness.launch("a", harness.run("env", str(out))))
    wait_for(backend, ended("a"))
    assert read_envs(out, 1)[0]["cwd"] == str(backend.layout.job_dir("a"))
    (backend.layout.job_dir("b") / "sub").mkdir(parents=True)
    (out / "env-0.json").unlink()
    backend.launch(harness.launch("b", harness.run("env", str(out), workdir="sub")))
    wait_for(backend, ended("b"))
    assert read_envs(out, 1)[0]["cwd"] == str(backend.layout.job_dir("b") / "sub")


def test_fractional_worker_gets_its_share_of_memory(harness: Harness) -> None:
    out = harness.root / "out"
    out.mkdir()
    backend = harness.backend()
    half = WorkerRequest(gpus=1, gpu_milli=500)
    backend.launch(harness.launch("half", harness.run("env", str(out)), gpus=((2,),), request=half))
    wait_for(backend, ended("half"))
    env = read_envs(out, 1)[0]["env"]
    assert env["GPUFLEET_GPU_FRACTION"] == "0.5"
    assert env["GPUFLEET_GPU_MEMORY_BYTES"] == str(40 * GiB)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.500"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert env["CUDA_VISIBLE_DEVICES"] == harness.node.gpus[2].uuid
    # An explicit GPU memory request is the share's memory.
    (out / "env-0.json").unlink()
    small = WorkerRequest(gpus=1, gpu_milli=250, gpu_memory=10 * GiB)
    backend.launch(harness.launch("quarter", harness.run("env", str(out)), request=small))
    wait_for(backend, ended("quarter"))
    env = read_envs(out, 1)[0]["env"]
    assert env["GPUFLEET_GPU_FRACTION"] == "0.25"
    assert env["GPUFLEET_GPU_MEMORY_BYTES"] == str(10 * GiB)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.125"


def test_worker_without_gpus_sees_none(harness: Harness) -> None:
    out = harness.root / "out"
    out.mkdir()
    backend = harness.backend()
    backend.launch(harness.launch("cpu", harness.run("env", str(out)), gpus=((),)))
    wait_for(backend, ended("cpu"))
    env = read_envs(out, 1)[0]["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["GPUFLEET_GPU_INDICES"] == ""


def test_concurrent_jobs_get_distinct_ports_and_skip_a_busy_one(harness: Harness) -> None:
    out_a, out_b = harness.root / "a", harness.root / "b"
    out_a.mkdir()
    out_b.mkdir()
    busy = socket.socket()
    try:
        try:
            busy.bind(("127.0.0.1", 29500))
            busy.listen()
        except OSError:
            pass  # something else holds it already: busy either way
        backend = harness.backend()
        # Both stay running (they wait for a file) so that both hold their port at once.
        gate = harness.root / "go"
        for job, out in (("a", out_a), ("b", out_b)):
            run = RunSpec(
                (
                    "sh",
                    "-c",
                    f'"$0" "$1" env {out} && exec "$0" "$1" wait {gate} 0',
                    harness.run().command[0],
                    str(harness.program),
                )
            )
            backend.launch(harness.launch(job, run))
        ports = [int(read_envs(out, 1)[0]["env"]["MASTER_PORT"]) for out in (out_a, out_b)]
        assert 29500 not in ports
        assert ports[0] != ports[1]
        assert set(backend.ports.held) == set(ports)
        gate.touch()
        wait_for(backend, lambda seen: ended("a")(seen) and ended("b")(seen))
        assert backend.ports.held == {}
    finally:
        busy.close()


def test_exit_codes_propagate(harness: Harness) -> None:
    backend = harness.backend()
    backend.launch(harness.launch("seven", harness.run("exit", "7")))
    backend.launch(harness.launch("zero", harness.run("exit", "0")))
    backend.launch(harness.launch("shell", RunSpec(("echo $GPUFLEET_JOB_ID; exit 4",), shell=True)))
    backend.launch(harness.launch("missing", RunSpec(("/no/such/program",))))
    backend.launch(harness.launch("killed", RunSpec(("sh", "-c", "kill -9 $$"))))
    backend.launch(harness.launch("nowhere", RunSpec(("true",), workdir="/no/such/folder")))
    # The job's environment is the command's, not the shim's: a PYTHONHOME that breaks Python breaks only it.
    backend.launch(harness.launch("pyhome", RunSpec(("echo", "ok"), env=(("PYTHONHOME", "/nope"),))))
    jobs = ("seven", "zero", "shell", "missing", "killed", "nowhere", "pyhome")
    seen = wait_for(backend, lambda seen: all(ended(j)(seen) for j in jobs))
    assert only(seen, "seven", K.EXITED).exit_code == 7
    assert only(seen, "seven", K.EXITED).detail == "worker 0 exited 7"
    assert only(seen, "zero", K.EXITED).exit_code == 0
    assert only(seen, "shell", K.EXITED).exit_code == 4
    assert backend.log_paths("shell")[0].read_text() == "shell\n"
    missing = only(seen, "missing", K.EXITED)
    assert missing.exit_code == 127
    assert "could not start" in missing.detail
    assert "/no/such/program" in missing.detail
    killed = only(seen, "killed", K.EXITED)
    assert killed.exit_code == 137
    assert "SIGKILL" in killed.detail
    # STARTED before the end, once, for the ones that started.
    nowhere = only(seen, "nowhere", K.EXITED)
    assert nowhere.exit_code == 127
    assert "cannot use the working folder '/no/such/folder'" in nowhere.detail
    assert only(seen, "pyhome", K.EXITED).exit_code == 0
    assert backend.log_paths("pyhome")[0].read_text() == "ok\n"
    for job in ("seven", "zero", "shell", "killed"):
        kinds = [o.kind for o in seen if o.job_id == job]
        assert kinds == [K.STARTED, K.EXITED]
    assert [o.kind for o in seen if o.job_id == "missing"] == [K.EXITED]
    assert "gpufleet: cannot start" in backend.log_paths("missing")[0].read_text()  # said in its log too
    assert backend.poll() == []


def test_gang_member_failure_stops_the_others(harness: Harness) -> None:
    backend = harness.backend()
    launch = harness.launch("gang", harness.run("fail-rank", "1", "3"), gpus=((0,), (1,), (2,)))
    backend.launch(launch)
    seen = wait_for(backend, ended("gang"), timeout=backend.gang_grace_s + TIMEOUT_EXTRA)
    exited = only(seen, "gang", K.EXITED)
    assert exited.exit_code == 3
    assert exited.detail == "worker 1 exited 3"
    for rank in (0, 2):
        code = harness.worker_file(launch, rank, "exit.json")
        assert code is not None
        if harness.worker_file(launch, rank, "child.pid") is None:
            # The stop came before this worker's command started (on a busy machine): it never ran.
            assert code.get("not_started") is True
            continue
        assert not pid_alive(harness.child_pid(launch, rank))
        assert code["code"] == 128 + 15  # stopped by our SIGTERM


TIMEOUT_EXTRA = 5.0


def test_stop_sends_the_checkpoint_signal_and_the_job_ends_stopped(harness: Harness) -> None:
    backend = harness.backend()
    saved = harness.root / "ckpt"
    launch = harness.launch("ck", harness.run("checkpoint", str(saved), checkpoint_signal="SIGUSR1"))
    backend.launch(launch)
    wait_for(backend, has("ck", K.STARTED))
    wait_until(Path(f"{saved}.ready").exists, what="the program's handler")
    backend.stop("ck", 1, grace_s=30.0, reason="preempted for big")
    backend.stop("ck", 1, grace_s=30.0, reason="again")  # idempotent
    seen = wait_for(backend, ended("ck"))
    stopped = only(seen, "ck", K.STOPPED)
    assert stopped.detail == "preempted for big"
    assert saved.read_text() == "saved on SIGUSR1"
    # The shim lived through the signal and recorded the clean exit.
    exit_record = harness.worker_file(launch, 0, "exit.json")
    assert exit_record is not None
    assert exit_record["code"] == 0


def test_a_process_ignoring_the_signal_is_killed_after_the_grace(harness: Harness) -> None:
    backend = harness.backend()
    ready = harness.root / "ready"
    launch = harness.launch("stubborn", harness.run("ignore-term", str(ready)))
    backend.launch(launch)
    wait_for(backend, has("stubborn", K.STARTED))
    wait_until(ready.exists, what="the program to ignore SIGTERM")
    asked = time.monotonic()
    backend.stop("stubborn", 1, grace_s=0.3, reason="cancelled")
    seen = wait_for(backend, ended("stubborn"))
    took = time.monotonic() - asked
    assert only(seen, "stubborn", K.STOPPED).detail == "cancelled"
    assert 0.3 <= took < 3.0
    exit_record = harness.worker_file(launch, 0, "exit.json")
    assert exit_record is not None
    assert exit_record["code"] == 137


def test_stop_right_after_launch_stops_it(harness: Harness) -> None:
    backend = harness.backend()
    backend.launch(harness.launch("quick", harness.run("wait", str(harness.root / "never"), "0")))
    backend.stop("quick", 1, grace_s=5.0, reason="cancelled")
    seen = wait_for(backend, ended("quick"))
    assert only(seen, "quick", K.STOPPED).detail == "cancelled"


def test_stop_of_unknown_or_finished_jobs_is_ignored(harness: Harness) -> None:
    backend = harness.backend()
    backend.stop("nobody", 1, grace_s=1.0, reason="x")
    backend.launch(harness.launch("done", harness.run("exit", "0")))
    wait_until(lambda: harness.state.joinpath("run/done/attempt-1/worker-0/exit.json").exists(), what="exit")
    backend.stop("done", 1, grace_s=1.0, reason="too late")
    backend.stop("done", 2, grace_s=1.0, reason="other attempt")
    seen = wait_for(backend, ended("done"))
    assert only(seen, "done", K.EXITED).exit_code == 0  # it ended by itself first


def test_logs_capture_stdout_and_stderr_per_attempt_and_worker(harness: Harness) -> None:
    backend = harness.backend()
    backend.launch(harness.launch("talk", harness.run("print"), gpus=((0,), (1,))))
    wait_for(backend, ended("talk"))
    backend.launch(harness.launch("talk", harness.run("print"), attempt=2))
    wait_for(backend, lambda seen: any(o.attempt == 2 and o.kind is K.EXITED for o in seen))
    paths = backend.log_paths("talk")
    assert [(p.parent.name, p.name) for p in paths] == [
        ("attempt-1", "worker-0.log"),
        ("attempt-1", "worker-1.log"),
        ("attempt-2", "worker-0.log"),
    ]
    for path in paths:
        assert path.read_text() == "to stdout\nto stderr\n"
    assert backend.log_paths("nobody") == []


def test_launch_is_idempotent_per_attempt(harness: Harness) -> None:
    backend = harness.backend()
    starts = harness.root / "starts"
    launch = harness.launch("once", harness.run("count", str(starts)))
    backend.launch(launch)
    backend.launch(launch)
    wait_for(backend, has("once", K.STARTED))
    backend.launch(launch)
    # Even a new backend on the same state folder does not start it again: it watches the running one.
    other = harness.backend()
    other.launch(launch)
    wait_for(other, has("once", K.STARTED))
    wait_until(starts.exists, what="the command to write its line")  # a loaded machine may take a while
    time.sleep(0.3)  # a second start would take well under this to write its line
    assert starts.read_text() == "started\n"
    backend.stop("once", 1, grace_s=0.0, reason="done")
    wait_for(backend, ended("once"))


def test_a_job_without_run_spec_fails_for_good_and_one_on_an_unknown_node_is_lost(harness: Harness) -> None:
    backend = harness.backend()
    backend.launch(harness.launch("norun", None))
    stray = harness.launch("stray", harness.run("exit", "0"))
    stray = Launch(stray.job, 1, (WorkerPlacement("elsewhere", (GpuShare(0),)),))
    backend.launch(stray)
    seen = wait_for(backend, lambda seen: ended("norun")(seen) and ended("stray")(seen))
    norun = only(seen, "norun", K.EXITED)
    assert norun.exit_code == 127
    assert "no command" in norun.detail
    lost = only(seen, "stray", K.LOST)
    assert "'elsewhere'" in lost.detail
    assert "to fix" in lost.detail
    assert backend.ports.held == {}


def test_a_vanished_shim_makes_the_job_lost_and_its_command_killed(harness: Harness) -> None:
    backend = harness.backend()
    launch = harness.launch("fragile", harness.run("ignore-term", str(harness.root / "ready")))
    backend.launch(launch)
    wait_for(backend, has("fragile", K.STARTED))
    child = harness.child_pid(launch)
    os.kill(harness.shim_pid(launch), signal.SIGKILL)
    seen = wait_for(backend, ended("fragile"))
    assert only(seen, "fragile", K.LOST).detail == "worker 0 process vanished"
    wait_until(lambda: not pid_alive(child), what="the orphaned command to be killed")


def test_shutdown_with_stop_jobs_stops_everything(harness: Harness) -> None:
    backend = harness.backend()
    ready = harness.root / "ready"
    a = harness.launch("a", harness.run("ignore-term", str(ready)))
    b = harness.launch("b", harness.run("checkpoint", str(harness.root / "ck")))
    backend.launch(a)
    backend.launch(b)
    wait_until(lambda: ready.exists() and (harness.root / "ck.ready").exists(), what="the handlers")
    backend.shutdown(stop_jobs=True, grace_s=0.3)
    assert not pid_alive(harness.child_pid(a))
    assert not pid_alive(harness.child_pid(b))
    assert (harness.root / "ck").read_text() == "saved on SIGTERM"
    # The store still thinks they run: they come back as lost, to be retried.
    seen = backend.poll()
    assert {o.job_id: o.kind for o in seen} == {"a": K.LOST, "b": K.LOST}


def test_observation_times_come_from_the_given_clock(harness: Harness) -> None:
    class Frozen:
        def now(self) -> float:
            return 1000.0

    backend = LocalBackend(harness.state, [harness.node], Frozen(), emulated=True)
    backend.launch(harness.launch("t", harness.run("exit", "0")))
    seen = wait_for(backend, ended("t"))
    # Each time is "now" on the given clock, less how long ago it happened (a fraction of a second here).
    assert all(999.0 < o.at <= 1000.0 for o in seen)


def test_bad_master_address_is_refused_with_a_fix(harness: Harness) -> None:
    import pytest

    from gpufleet.domain.errors import GpufleetError

    with pytest.raises(GpufleetError, match="to fix: set master_addr"):
        harness.backend(master_addr="203.0.113.7")
    assert read_json(harness.root / "nothing") is None
