"""One team cannot take the host from the others: memory, processes, disk, and the jobs' home.

Real jobs, as root, on real cgroups (this host: v1), real loop-mounted ext4 file systems and real job users,
through the local executor (`isolation_kit`) or a real `gpufleet up` (`live`):

- a job that gives no `memory` gets a limit (its queue's share per GPU held, half of it for half a GPU, the
  queue's own for a job without GPU) and is OOM-killed past it; an administrator's per-queue setting
  changes it (`quota set --memory-per-gpu`);
- four workers of one team that fork as much as they can take no more processes than the node keeps for
  jobs (pid_max less the reserve), whatever each worker's own pids limit says;
- a team's disk quota (`quota set --disk`): its filler gets ENOSPC at the quota, on a small data disk
  where, without it, the filler took every byte; the other team's submits and jobs go on, and the store
  stays writable; a quota below what the files take is refused, a larger one is applied to the mounted file
  system at once; a restart mounts it again;
- `--jobs-home` holds for a queue user that exists: its home (files and all) moves when none of its jobs
  runs, and `up` refuses, saying how to fix it, while one does.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gpufleet.adapters.local import cgroups as cg
from gpufleet.adapters.local import host_limits
from gpufleet.adapters.local.isolation import Isolation
from gpufleet.adapters.local.users import Users
from gpufleet.domain import GpuShare, Job, WorkerPlacement, WorkerRequest
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.jobs import RunSpec
from gpufleet.ports import Launch, ObservationKind
from tests.kit.jobusers import JOB_PYTHON, reachable_by_jobs, share, users_created_here
from tests.kit.small_disk import small_disk
from tests.local.conftest import ended, only, wait_for
from tests.local.isolation_kit import Isolated, isolated_setup, require_cgroups
from tests.server.live import Live, start

MiB = 1 << 20
GiB = 1 << 30
K = ObservationKind


# --- the arithmetic ---------------------------------------------------------------------------------------


def test_the_reserve_is_two_gib_or_a_tenth_and_never_more_than_half() -> None:
    assert host_limits.default_reserve(24 * GiB, 2 * GiB) == int(2.4 * GiB)
    assert host_limits.default_reserve(8 * GiB, 2 * GiB) == 2 * GiB
    assert host_limits.default_reserve(3 * GiB, 2 * GiB) == int(1.5 * GiB)
    budget = host_limits.budget(24 * GiB, 32768)
    assert budget.job_memory == 24 * GiB - budget.memory_reserve
    assert budget.job_pids == 32768 - 3276


def test_a_job_without_memory_gets_its_share_per_gpu_held_fractions_included() -> None:
    budget = host_limits.budget(80 * GiB, 32768, memory_reserve=16 * GiB)  # 64 GiB for jobs
    share = {"budget": budget, "node_gpus": 8}
    assert host_limits.default_memory(gpu_milli=1000, **share) == 8 * GiB  # type: ignore[arg-type]
    assert host_limits.default_memory(gpu_milli=500, **share) == 4 * GiB  # type: ignore[arg-type]
    assert host_limits.default_memory(gpu_milli=3000, **share) == 24 * GiB  # type: ignore[arg-type]
    assert host_limits.default_memory(gpu_milli=0, **share) == 8 * GiB  # type: ignore[arg-type]
    # The queue's own numbers win, and never beyond what the node keeps for jobs.
    assert host_limits.default_memory(gpu_milli=500, per_gpu=64 * MiB, **share) == 32 * MiB  # type: ignore[arg-type]
    assert host_limits.default_memory(gpu_milli=0, no_gpu=64 * MiB, **share) == 64 * MiB  # type: ignore[arg-type]
    assert host_limits.default_memory(gpu_milli=8000, per_gpu=16 * GiB, **share) == 64 * GiB  # type: ignore[arg-type]
    # An emulated node that claims more memory than the machine has gets the machine's.
    big = host_limits.default_memory(budget, gpu_milli=1000, node_gpus=8, node_memory=2048 * GiB)
    assert big == 8 * GiB


def test_a_reserve_that_leaves_jobs_nothing_is_refused_with_a_fix() -> None:
    with pytest.raises(GpufleetError) as refused:
        host_limits.budget(8 * GiB, 32768, memory_reserve=8 * GiB)
    assert "--memory-reserve" in refused.value.message
    assert refused.value.fix
    with pytest.raises(GpufleetError):
        host_limits.budget(8 * GiB, 32768, pids_reserve=32768)


@given(
    memory=st.integers(4 * GiB, 4096 * GiB),
    gpus=st.integers(1, 16),
    shares=st.lists(st.integers(1, 1000), min_size=1, max_size=64),
)
def test_the_default_limits_of_a_nodes_gpu_jobs_never_add_up_past_its_allocatable_memory(
    memory: int, gpus: int, shares: list[int]
) -> None:
    assume(sum(shares) <= gpus * 1000)  # what the scheduler can place on the node's GPUs
    budget = host_limits.budget(memory, 32768)
    assume(budget.job_memory // gpus * min(shares) // 1000 >= host_limits.MIN_MEMORY)
    limits = [host_limits.default_memory(budget, gpu_milli=milli, node_gpus=gpus) for milli in shares]
    assert sum(limits) <= budget.job_memory


# --- real jobs on the executor ----------------------------------------------------------------------------


@pytest.fixture
def iso(tmp_path: Path) -> Iterator[Isolated]:
    with isolated_setup(tmp_path) as found:
        yield found


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[cg.Cgroups]:
    """Cgroups of a tag of this test's own: the caps it sets on all jobs touch no other test's workers."""
    found = require_cgroups(f"hl{os.getpid() % 10000}{abs(hash(tmp_path)) % 10000}")
    for control in ("memory", "pids"):
        if control not in found.controls:
            pytest.fail(f"the {control} controller should work here: {found.describe()}")
    yield found
    found.release()


def launch(iso: Isolated, job_id: str, run: Any, *, shares: tuple[int, ...] = (1000,), **queue: Any) -> Launch:
    """A job of queue iso-a that gives no memory, holding GPUs 0.. with these milli shares."""
    placement = WorkerPlacement(iso.node.name, tuple(GpuShare(i, milli) for i, milli in enumerate(shares)), 0, 0)
    request = WorkerRequest(gpus=len(shares), memory=0)
    return Launch(Job(job_id, "iso-a", request, run=run), 1, (placement,), **queue)


def limit_of(groups: cg.Cgroups, name: str) -> int:
    return int((Path(groups.bases["memory"]) / name / "memory.limit_in_bytes").read_text())


def test_a_job_without_memory_gets_its_queues_share_and_is_oom_killed_past_it(
    iso: Isolated, groups: cg.Cgroups
) -> None:
    budget = host_limits.detect()
    isolation = Isolation(Users(iso.jobs_home), groups, host=budget)
    backend = iso.backend(isolation)
    trigger = iso.shared / "end"
    backend.launch(launch(iso, "hog", iso.run("hog", "200"), memory_per_gpu=64 * MiB))
    backend.launch(launch(iso, "half", iso.run("hog", "100"), shares=(500,), memory_per_gpu=128 * MiB))
    backend.launch(launch(iso, "nogpu", iso.run("hog", "200"), shares=(), memory_no_gpu=64 * MiB))
    backend.launch(launch(iso, "roomy", iso.run("hog", "200"), memory_per_gpu=512 * MiB))
    backend.launch(launch(iso, "plain", iso.run("wait", str(trigger), "0")))
    seen = wait_for(backend, lambda seen: all(ended(j)(seen) for j in ("hog", "half", "nogpu", "roomy")), timeout=60)
    for job, limit in (("hog", "64 MiB"), ("half", "64 MiB"), ("nogpu", "64 MiB")):
        exited = only(seen, job, K.EXITED)
        assert exited.exit_code == 137, (job, exited)
        assert f"out of memory (limit {limit})" in exited.detail
    assert only(seen, "roomy", K.EXITED).exit_code == 0
    # No queue setting: the node's memory less its reserve, shared among its 8 GPUs (this machine's, since the
    # emulated node claims more than it has).
    assert not ended("plain")(seen), seen
    wanted = host_limits.default_memory(budget, gpu_milli=1000, node_gpus=8, node_memory=iso.node.memory)
    assert wanted - 4096 < limit_of(groups, "plain.1.0") <= wanted  # the kernel keeps whole pages
    assert limit_of(groups, "plain.1.0") < budget.job_memory
    trigger.touch()
    assert only(wait_for(backend, ended("plain"), timeout=30, seen=seen), "plain", K.EXITED).exit_code == 0


FORKER = r"""
import os, sys, time
out, trigger = sys.argv[1], sys.argv[2]
started = 0
while started < 2000:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        while not os.path.exists(trigger):
            time.sleep(0.2)
        os._exit(0)
    started += 1
with open(out + ".tmp", "w") as f:
    f.write(str(started))
os.replace(out + ".tmp", out)
while not os.path.exists(trigger):
    time.sleep(0.05)
"""


def test_four_workers_forking_all_they_can_leave_the_node_its_reserve_of_processes(iso: Isolated) -> None:
    # A node of 400 process ids keeping 100: its jobs together get 300, each worker up to 150 of them. Four
    # workers of one team want 600.
    budget = host_limits.budget(host_limits.detect().memory, 400, pids_reserve=100)
    isolation = Isolation.detect(iso.state, jobs_home=iso.jobs_home, pids_limit=150, host=budget)
    groups = isolation.cgroups
    if "pids" not in groups.controls:
        pytest.fail(f"the pids controller should work here: {groups.describe()}")
    assert isolation.cap_problems == {}
    backend = iso.backend(isolation)
    forker, trigger = share(iso.shared / "forker.py", FORKER), iso.shared / "release"
    outs = [iso.out(f"forks{n}") for n in range(4)]
    try:
        for n, out in enumerate(outs):
            run = RunSpec((JOB_PYTHON, str(forker), out, str(trigger)))
            backend.launch(iso.launch(f"forks{n}", run, gpus=(n,)))
        counts = [int(read_out_text(out)) for out in outs]
        held = int((Path(groups.bases["pids"]) / "pids.current").read_text())
        # Root forks as it likes meanwhile: the node kept its reserve.
        assert subprocess.run(["true"], check=False).returncode == 0
    finally:
        trigger.touch()
    assert held <= budget.job_pids
    assert sum(counts) + 4 <= budget.job_pids, counts  # each worker's own process counts too
    assert max(counts) < 150
    assert int((Path(groups.bases["pids"]) / "pids.max").read_text()) == budget.job_pids
    wait_for(backend, lambda seen: all(ended(f"forks{n}")(seen) for n in range(4)), timeout=60)


def read_out_text(path: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError(f"the job wrote no {path} in {timeout_s} s")
        time.sleep(0.02)
    return Path(path).read_text()


# --- a real `gpufleet up`: the administrator's settings ---------------------------------------------------

# Writes 1 MiB blocks into its working folder until the disk refuses, says how far it got, exits 1 (ENOSPC) or
# 0 (it wrote all it wanted). argv: MiB wanted.
FILLER = r"""
import errno, os, sys
wanted, written = int(sys.argv[1]), 0
try:
    with open("filler", "wb") as f:
        while written < wanted:
            f.write(b"f" * (1 << 20))
            f.flush()
            os.fsync(f.fileno())
            written += 1
except OSError as error:
    print(f"FILLER stopped after {written} MiB: {errno.errorcode.get(error.errno)}", flush=True)
    sys.exit(1)
print(f"FILLER wrote {written} MiB", flush=True)
"""

CLI = (sys.executable, "-m", "gpufleet")
PRINTER = "import sys\nprint('PRINTER', flush=True)\nfor _ in range(1024): sys.stdout.write('y' * 65535 + '\\n')"
HOG = "b = bytearray(200 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('HOG done', flush=True)"


def submit(client: httpx.Client, queue: str, command: list[str], **spec: Any) -> str:
    response = client.post("/v1/jobs", json={"queue": queue, "command": command, "gpus": 1, **spec})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def log_of(client: httpx.Client, job: str) -> str:
    return str(client.get(f"/v1/jobs/{job}/logs").json().get("text", ""))


def set_queue(client: httpx.Client, queue: str, **settings: Any) -> httpx.Response:
    return client.put(f"/v1/queues/{queue}", json=settings)


@contextlib.contextmanager
def unmounted_after(folder: Path) -> Iterator[None]:
    """Unmount, deepest first, what a test left mounted under `folder` (the queues' quota file systems)."""
    try:
        yield
    finally:
        for point in sorted(mounts_under(folder), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def mounts_under(folder: Path) -> list[str]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith(str(folder) + "/"):
            found.append(point)
    return found


@pytest.mark.slow
def test_an_admin_sets_a_queues_memory_per_gpu_and_its_jobs_without_memory_get_it(tmp_path: Path) -> None:
    with users_created_here():
        homes = reachable_by_jobs(tmp_path / "homes")
        live = start(tmp_path, "--jobs-home", str(homes))
        try:
            with live.http() as client:
                assert set_queue(client, "hl-team-m", memory_per_gpu="64MiB").status_code == 200
                listed = {q["name"]: q for q in client.get("/v1/queues").json()["queues"]}
                assert listed["hl-team-m"]["memory_per_gpu"] == 64 * MiB
                small = submit(client, "hl-team-m", [JOB_PYTHON, "-c", HOG])
                ended_small = live.wait_state(client, small, "failed", "succeeded", timeout_s=60)
                assert ended_small["state"] == "failed"
                assert "out of memory (limit 64 MiB)" in str(ended_small["reason"]), ended_small
                cli = subprocess.run(
                    [*CLI, "quota", "set", "hl-team-m", "--memory-per-gpu", "512MiB", "--url", live.url,
                     "--token", live.server.token],
                    capture_output=True, text=True, check=False,
                )  # fmt: skip
                assert cli.returncode == 0, cli.stderr
                roomy = submit(client, "hl-team-m", [JOB_PYTHON, "-c", HOG])
                assert live.wait_state(client, roomy, "failed", "succeeded", timeout_s=60)["state"] == "succeeded"
        finally:
            live.server.stop()


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 96 MiB data disk that holds the store, the logs and the jobs' homes (their quota images too)."""
    with (
        small_disk(reachable_by_jobs(tmp_path / "disk"), 96) as folder,
        users_created_here(),
        unmounted_after(folder),
    ):
        yield folder


def free_mib(folder: Path) -> float:
    stat = os.statvfs(folder)
    return stat.f_bavail * stat.f_frsize / MiB


@pytest.mark.slow
def test_a_queues_disk_quota_stops_its_filler_and_no_other_team_or_the_store_feels_it(disk: Path) -> None:
    homes = disk / "homes"
    live = start(disk, "--jobs-home", str(homes))
    filler = share(live.shared / "filler.py", FILLER)
    try:
        with live.http() as client:
            created = set_queue(client, "hl-team-a", disk="24MiB")
            assert created.status_code == 200, created.text
            assert set_queue(client, "hl-team-b").status_code == 200
            # hl-team-a wants 200 MiB, twice the whole disk: without a quota it takes every byte, the store's too.
            fill = submit(client, "hl-team-a", [JOB_PYTHON, str(filler), "200"])
            ended_fill = live.wait_state(client, fill, "failed", "succeeded", timeout_s=90)
            assert ended_fill["state"] == "failed"
            assert "FILLER stopped after" in log_of(client, fill)
            assert "ENOSPC" in log_of(client, fill)
            reason = str(ended_fill["reason"])
            assert "disk quota (24 MiB) is full" in reason, reason
            assert "quota set" in reason
            written = int(log_of(client, fill).split("FILLER stopped after ")[1].split()[0])
            assert 16 <= written <= 24
            assert free_mib(disk) > 40  # the disk kept its room
            # hl-team-b submits and its job writes: nothing of hl-team-a's reaches it; the store takes every write.
            other = submit(client, "hl-team-b", [JOB_PYTHON, str(filler), "8"])
            assert live.wait_state(client, other, "failed", "succeeded", timeout_s=60)["state"] == "succeeded"
            assert "FILLER wrote 8 MiB" in log_of(client, other)
            # What hl-team-a's jobs print counts toward its quota too: 64 MiB of output leaves the data disk as it was.
            before = free_mib(disk)
            loud = submit(client, "hl-team-a", [JOB_PYTHON, "-c", PRINTER])
            live.wait_state(client, loud, "failed", "succeeded", timeout_s=60)
            assert free_mib(disk) > before - 2
            assert (disk / "data" / "jobs" / "logs" / loud).is_symlink()
            assert "PRINTER" in log_of(client, loud)
            # A quota below what hl-team-a keeps is refused, saying so; a larger one holds at once.
            lower = set_queue(client, "hl-team-a", disk="8MiB")
            assert lower.status_code == 422
            assert "more than the new disk quota" in lower.text, lower.text
            assert set_queue(client, "hl-team-a", disk="48MiB").status_code == 200
            home = Path(next(line.split()[4] for line in mounts(homes)))
            assert os.statvfs(home).f_blocks * os.statvfs(home).f_frsize > 40 * MiB
            report = client.get("/healthz").json()
            assert "disk" in json_text(report)
        live.server.stop()
        # A reboot (nothing mounted any more): the next start mounts hl-team-a's quota again, files and all.
        subprocess.run(["umount", str(home)], check=True)
        live.restart("--jobs-home", str(homes))
        assert mounts(homes), "the quota file system was not mounted again at start"
        assert (home / "gpufleet-jobs").is_dir()
    finally:
        live.server.stop()


def mounts(folder: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if f" {folder}/" in line]


def json_text(value: Any) -> str:
    import json

    return json.dumps(value)


# Notes its HOME and working folder, and whether what the queue's previous job kept in its home is there.
HOMEBODY = r"""
import json, os, sys
home = os.environ["HOME"]
found = {"home": home, "cwd": os.getcwd(), "kept": os.path.exists(os.path.join(home, "kept"))}
open(os.path.join(home, "kept"), "w").write("x")
print("HOMEBODY " + json.dumps(found), flush=True)
if len(sys.argv) > 1:
    import time
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
"""


def homebody(client: httpx.Client, live: Live, program: Path, *args: str) -> str:
    return submit(client, "hl-team-h", [JOB_PYTHON, str(program), *args], gpus=0)


def seen_by(client: httpx.Client, job: str) -> dict[str, Any]:
    import json

    line = next(line for line in log_of(client, job).splitlines() if line.startswith("HOMEBODY "))
    found: dict[str, Any] = json.loads(line.removeprefix("HOMEBODY "))
    return found


@pytest.mark.slow
def test_jobs_home_moves_an_existing_queue_users_home_and_up_refuses_while_its_jobs_run(tmp_path: Path) -> None:
    import pwd
    import signal

    with users_created_here():
        first, second, third = (reachable_by_jobs(tmp_path / name) for name in ("first", "second", "third"))
        live = start(tmp_path, "--jobs-home", str(first))
        program = share(live.shared / "homebody.py", HOMEBODY)
        trigger = live.shared / "end"
        try:
            with live.http() as client:
                assert set_queue(client, "hl-team-h").status_code == 200
                job = homebody(client, live, program)
                live.wait_state(client, job, "succeeded", timeout_s=30)
                assert seen_by(client, job)["home"] == str(first / "gpufleet-hl-team-h")
            live.server.stop()
            # Another --jobs-home: the user exists (made by the first start); its home moves, files and all.
            live.restart("--jobs-home", str(second))
            with live.http() as client:
                job = homebody(client, live, program, str(trigger))
                live.wait_state(client, job, "running", timeout_s=30)
                until_logged(client, job, "HOMEBODY ")
                seen = seen_by(client, job)
                assert seen["home"] == str(second / "gpufleet-hl-team-h"), seen
                assert seen["kept"] is True, seen
                assert seen["cwd"].startswith(str(second / "gpufleet-hl-team-h") + "/")
                assert pwd.getpwnam("gpufleet-hl-team-h").pw_dir == str(second / "gpufleet-hl-team-h")
                assert not (first / "gpufleet-hl-team-h").exists()
            # The control plane dies; its job runs on in the second home. A start with a third is refused.
            live.server.stop(signal.SIGKILL)
            with pytest.raises(GpufleetError) as refused:
                live.restart("--jobs-home", str(third))
            said = refused.value.message
            assert "cannot move while its processes run" in said, said
            assert "to fix:" in said
            assert f"--jobs-home {second}" in said
            assert pwd.getpwnam("gpufleet-hl-team-h").pw_dir == str(second / "gpufleet-hl-team-h")
            live.restart("--jobs-home", str(second))  # as the fix says: it adopts the job
            trigger.touch()
            with live.http() as client:
                assert live.wait_state(client, job, "succeeded", timeout_s=30)["state"] == "succeeded"
        finally:
            trigger.touch()
            live.server.stop()


def until_logged(client: httpx.Client, job: str, text: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log_of(client, job):
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job} logged no {text!r} in {timeout_s} s: {log_of(client, job)[-500:]}")
        time.sleep(0.05)
