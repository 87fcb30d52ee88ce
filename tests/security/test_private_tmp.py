"""A hostile job against what jobs on one node share: /tmp, /dev/shm and /proc. Real users, real cgroups,
real mount namespaces, on the local executor (and the `gpufleet up` it runs as root):

- what a job leaves in /dev/shm is gone, and its memory freed, once its attempt ends (no mount of it left in
  any process), also for an attempt that ended while the control plane was down, and for a crashed run's
  leftovers;
- what a job keeps in /dev/shm counts against its memory limit;
- another team's job cannot see or read a team's /tmp and /dev/shm while both run, nor plant a name there
  that a later job reads;
- a job sees only its own user's processes in /proc: not the control plane's, nor another team's;
- the workers of one attempt share /dev/shm (NCCL's shared-memory transport between local ranks needs it).

The same on the Ray test cluster is in tests/ray/test_sandbox.py (it shares that session's cluster).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.adapters.local import cgroups as cg
from gpufleet.adapters.local import namespaces
from gpufleet.adapters.local.isolation import Isolation
from gpufleet.domain import GpuShare, Job, WorkerPlacement, WorkerRequest
from gpufleet.domain.jobs import RunSpec
from gpufleet.ports import Launch, ObservationKind
from tests.kit.jobusers import JOB_PYTHON, share, users_created_here
from tests.local.conftest import ended, has, only, wait_for, wait_until
from tests.local.isolation_kit import Isolated, isolated_setup, read_out, require_cgroups, require_root
from tests.server.live import start

K = ObservationKind
MiB = 1 << 20

# The tenant: does what its arguments say, writes what it found to OUT (JSON), then waits for WAIT (if given).
TENANT = r"""
import errno, json, os, sys, time

def out(path, data):
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)

def wait(path):
    while path != "-" and not os.path.exists(path):
        time.sleep(0.02)

def fill(path, mib):
    written = 0
    try:
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(b"s" * (1 << 20))
                f.flush()
                written += 1
    except OSError as e:
        return written, errno.errorcode[e.errno]
    return written, None

def peek(path):
    try:
        if os.path.isdir(path):
            return sorted(os.listdir(path))
        with open(path, "rb") as f:
            return f.read(64).decode(errors="replace")
    except PermissionError:
        return "denied"
    except FileNotFoundError:
        return "absent"

mode, result, trigger, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
found = {"uid": os.getuid(), "pid": os.getpid(), "rank": os.environ.get("RANK"),
         "shm_dev": os.stat("/dev/shm").st_dev, "tmp_dev": os.stat("/tmp").st_dev, "tmp_seen": peek("/tmp")}
if mode == "shm":  # write MIB MiB into /dev/shm/NAME and a file into /tmp
    found["written"], found["error"] = fill("/dev/shm/" + args[0], int(args[1]))
    with open("/tmp/" + args[0], "w") as f:
        f.write("secret of " + str(os.getuid()))
elif mode == "anon-then-shm":  # hold ANON MiB of ordinary memory, then write SHM MiB into /dev/shm
    held = bytearray(int(args[0]) << 20)
    for i in range(0, len(held), 4096):
        held[i] = 1
    found["written"], found["error"] = fill("/dev/shm/gpufleet-test-hog", int(args[1]))
elif mode == "peek":  # what each PATH shows: a listing, the start of the file, "denied" or "absent"
    found["seen"] = {path: peek(path) for path in args}
elif mode == "plant":  # names another job might trust: NAME (a file anyone may write) and NAME-link
    for folder in ("/tmp", "/dev/shm"):
        with open(folder + "/" + args[0], "w") as f:
            f.write("planted")
        os.chmod(folder + "/" + args[0], 0o666)
        os.symlink("/etc/shadow", folder + "/" + args[0] + "-link")
elif mode == "ps":  # a ps-like listing, and the command lines of PIDS
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                procs[name] = os.stat("/proc/" + name).st_uid
            except FileNotFoundError:
                pass
    found["procs"] = procs
    found["cmdlines"] = {pid: peek("/proc/" + pid + "/cmdline") for pid in args}
elif mode == "gang":  # rank 0 leaves a note in /dev/shm; rank 1 reads it
    if found["rank"] == "0":
        with open("/dev/shm/note", "w") as f:
            f.write("from rank 0")
    else:
        deadline = time.time() + 10
        while not os.path.exists("/dev/shm/note") and time.time() < deadline:
            time.sleep(0.02)
        found["note"] = peek("/dev/shm/note")
out(result + ("." + found["rank"] if mode == "gang" else ""), found)
wait(trigger)
"""


@pytest.fixture
def iso(tmp_path: Path) -> Iterator[Isolated]:
    with isolated_setup(tmp_path) as iso:
        yield iso


@pytest.fixture(scope="module")
def groups() -> cg.Cgroups:
    return require_cgroups("test-private-tmp")


class Tenants:
    """Jobs of several teams (queues) on one executor that gives each attempt a private /tmp, /dev/shm and
    /proc, as `gpufleet up` as root does."""

    def __init__(self, iso: Isolated, groups: cg.Cgroups) -> None:
        require_root()
        self.iso = iso
        self.groups = groups
        self.program = share(iso.shared / "tenant.py", TENANT)
        self.backend = iso.backend(self.isolation())

    def isolation(self) -> Isolation:
        sandboxed = self.iso.per_queue_users(self.groups, private_tmp=True, hide_pids=True)
        tmp_off, proc_off = namespaces.unavailable()
        assert not tmp_off, f"this kernel refuses a private /tmp: {tmp_off}"
        assert not proc_off, f"this kernel refuses a proc that hides other users' processes: {proc_off}"
        return sandboxed

    def run(self, mode: str, result: str, trigger: Path | None, *args: str) -> RunSpec:
        return RunSpec((JOB_PYTHON, str(self.program), mode, result, str(trigger or "-"), *args))

    def launch(self, job_id: str, run: RunSpec, queue: str, memory: int = 256 * MiB, workers: int = 1) -> Launch:
        placements = tuple(WorkerPlacement(self.iso.node.name, (GpuShare(rank),), 0, memory) for rank in range(workers))
        request = WorkerRequest(gpus=1, memory=memory)
        return Launch(Job(job_id, queue, request, run=run, workers=workers), 1, placements)

    @property
    def tmp_root(self) -> Path:
        return self.backend.layout.tmp_root()


def mounts_of_device(dev: int) -> list[str]:
    """Every mount of the file system `dev`, in every process's mount namespace on the machine: a tmpfs (and
    the memory it holds) lives as long as one is left."""
    wanted = f"{os.major(dev)}:{os.minor(dev)}"
    found: list[str] = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
        except OSError:
            continue
        found.extend(f"{pid}: {line}" for line in lines if line.split(" ")[2] == wanted)
    return found


def attempt_mounts() -> list[str]:
    return namespaces.attempt_mounts()


def test_what_a_job_leaves_in_dev_shm_is_freed_when_its_attempt_ends(iso: Isolated, groups: cg.Cgroups) -> None:
    tenants = Tenants(iso, groups)
    result, trigger, name = iso.out("a"), iso.shared / "a-go", f"gpufleet-test-{secrets.token_hex(3)}"
    tenants.backend.launch(tenants.launch("a", tenants.run("shm", result, trigger, name, "64"), "pt-a"))
    found = read_out(result)
    assert found["written"] == 64
    assert found["error"] is None
    # The 64 MiB are in the attempt's own tmpfs, not the host's /dev/shm.
    assert found["shm_dev"] != os.stat("/dev/shm").st_dev
    assert not Path(f"/dev/shm/{name}").exists()
    own = tenants.backend.layout.attempt_tmp("a", 1)
    usage = os.statvfs(own)
    assert (usage.f_blocks - usage.f_bfree) * usage.f_frsize >= 64 * MiB
    assert mounts_of_device(found["shm_dev"])
    trigger.touch()
    seen = wait_for(tenants.backend, ended("a"))
    assert only(seen, "a", K.EXITED).exit_code == 0
    # Its memory is freed: no mount of its tmpfs is left anywhere, and its mount point is gone.
    wait_until(lambda: not mounts_of_device(found["shm_dev"]), timeout=5, what="the attempt's tmpfs to go")
    assert not own.exists()
    assert str(own) not in attempt_mounts()


def test_dev_shm_counts_against_the_jobs_memory_limit(iso: Isolated, groups: cg.Cgroups) -> None:
    tenants = Tenants(iso, groups)
    # 512 MiB into /dev/shm with a 64 MiB limit: stopped at the limit (no room, or killed out of memory).
    big = iso.out("big")
    fill = tenants.run("shm", big, None, "gpufleet-test-fill", "512")
    tenants.backend.launch(tenants.launch("big", fill, "pt-a", 64 * MiB))
    # 96 MiB of ordinary memory, then 64 MiB into /dev/shm, with a 128 MiB limit: the tmpfs has room, the
    # job's memory does not (the shared memory is charged to the job's cgroup).
    both_out = iso.out("both")
    tenants.backend.launch(
        tenants.launch("both", tenants.run("anon-then-shm", both_out, None, "96", "64"), "pt-b", 128 * MiB)
    )
    seen = wait_for(tenants.backend, lambda seen: ended("big")(seen) and ended("both")(seen), timeout=30)
    first = only(seen, "big", K.EXITED)
    if first.exit_code == 0:
        filled = read_out(big)
        assert filled["error"] == "ENOSPC", filled
        assert filled["written"] <= 64, filled
    else:  # SIGKILL: only the kernel's out-of-memory killer sends it here
        assert first.exit_code == 137, first
        assert not os.path.exists(big), read_out(big)
    both = only(seen, "both", K.EXITED)
    assert both.exit_code == 137, both
    assert not os.path.exists(both_out), read_out(both_out)  # killed before it got through its writes
    wait_until(lambda: not attempt_mounts_under(tenants.tmp_root), timeout=5, what="the tmpfs to go")
    # What they wrote before the limit stopped them went with their attempts, not into the host's /dev/shm.
    assert not Path("/dev/shm/gpufleet-test-fill").exists()
    assert not Path("/dev/shm/gpufleet-test-hog").exists()


def attempt_mounts_under(root: Path) -> list[str]:
    return [m for m in attempt_mounts() if Path(m).parent == root]


def test_a_team_cannot_see_or_read_another_teams_tmp_and_shm_while_both_run(iso: Isolated, groups: cg.Cgroups) -> None:
    tenants = Tenants(iso, groups)
    b_result, b_done = iso.out("b"), iso.shared / "b-done"
    secret = f"gpufleet-test-secret-{secrets.token_hex(3)}"
    tenants.backend.launch(tenants.launch("b", tenants.run("shm", b_result, b_done, secret, "1"), "pt-b"))
    b = read_out(b_result)
    b_host = tenants.backend.layout.attempt_tmp("b", 1)
    targets = [
        "/tmp",
        "/dev/shm",
        f"/tmp/{secret}",
        f"/dev/shm/{secret}",
        f"/proc/{b['pid']}/root/tmp/{secret}",  # through the other job's own view of the file system
        str(b_host / "tmp" / secret),  # the attempt's tmpfs on the host
    ]
    a_result = iso.out("a")
    tenants.backend.launch(tenants.launch("a", tenants.run("peek", a_result, None, *targets), "pt-a"))
    seen = read_out(a_result)["seen"]
    assert seen["/tmp"] == [], seen
    assert seen["/dev/shm"] == [], seen
    assert seen[targets[2]] == "absent", seen
    assert seen[targets[3]] == "absent", seen
    assert seen[targets[4]] == "absent", seen
    assert seen[targets[5]] in ("absent", "denied"), seen
    b_done.touch()
    wait_for(tenants.backend, lambda seen: ended("a")(seen) and ended("b")(seen))


def test_a_worker_holds_no_other_attempts_tmpfs_and_none_stays_after_the_last_attempt(
    iso: Isolated, groups: cg.Cgroups
) -> None:
    """In each worker's mount namespace the only tmpfs of ours are its own /tmp and /dev/shm (a copy of another
    attempt's would keep that one's memory alive); once the attempts end, none of theirs stays mounted."""
    tenants = Tenants(iso, groups)
    go = iso.shared / "both-go"
    results = {name: iso.out(name) for name in ("a", "b")}
    for name, queue in (("a", "pt-a"), ("b", "pt-b")):
        tenants.backend.launch(tenants.launch(name, tenants.run("shm", results[name], go, f"x-{name}", "1"), queue))
    pids = {name: read_out(result)["pid"] for name, result in results.items()}
    for pid in pids.values():
        ours = namespaces.attempt_mounts(f"/proc/{pid}/mountinfo")
        assert sorted(ours) == ["/dev/shm", "/tmp"], ours
    go.touch()
    wait_for(tenants.backend, lambda seen: ended("a")(seen) and ended("b")(seen))
    assert attempt_mounts_under(tenants.tmp_root) == []


def test_a_name_planted_in_tmp_or_shm_is_not_there_for_the_next_job(iso: Isolated, groups: cg.Cgroups) -> None:
    tenants = Tenants(iso, groups)
    name = f"gpufleet-test-planted-{secrets.token_hex(3)}"
    tenants.backend.launch(tenants.launch("plant", tenants.run("plant", iso.out("plant"), None, name), "pt-a"))
    wait_for(tenants.backend, ended("plant"))
    paths = [f"/tmp/{name}", f"/tmp/{name}-link", f"/dev/shm/{name}", f"/dev/shm/{name}-link", "/tmp", "/dev/shm"]
    result = iso.out("victim")
    tenants.backend.launch(tenants.launch("victim", tenants.run("peek", result, None, *paths), "pt-b"))
    seen = read_out(result)["seen"]
    assert seen == {**dict.fromkeys(paths[:4], "absent"), "/tmp": [], "/dev/shm": []}, seen
    # Not on the host either: the plant never reached the host's /tmp or /dev/shm.
    assert not any(os.path.lexists(p) for p in paths[:4])
    wait_for(tenants.backend, ended("victim"))


def test_a_job_sees_only_its_own_users_processes(iso: Isolated, groups: cg.Cgroups) -> None:
    tenants = Tenants(iso, groups)
    b_result, b_done = iso.out("b"), iso.shared / "b-done"
    tenants.backend.launch(tenants.launch("b", tenants.run("peek", b_result, b_done), "pt-b"))
    b = read_out(b_result)
    # A root process whose command line holds what a job must not read (as Ray's processes hold addresses).
    secret = subprocess.Popen(["sleep", "60", "--gcs-address=10.0.0.1:6379"], stderr=subprocess.DEVNULL)
    try:
        pids = ["1", str(os.getpid()), str(secret.pid), str(b["pid"])]
        result = iso.out("a")
        tenants.backend.launch(tenants.launch("a", tenants.run("ps", result, None, *pids), "pt-a"))
        a = read_out(result)
        assert a["procs"], a
        assert set(a["procs"].values()) == {a["uid"]}, a["procs"]  # only its own user's processes
        assert str(a["pid"]) in a["procs"]
        assert a["cmdlines"] == dict.fromkeys(pids, "absent"), a["cmdlines"]
    finally:
        secret.send_signal(signal.SIGKILL)
        secret.wait()
    b_done.touch()
    wait_for(tenants.backend, lambda seen: ended("a")(seen) and ended("b")(seen))


def test_the_workers_of_one_attempt_on_a_node_share_dev_shm(iso: Isolated, groups: cg.Cgroups) -> None:
    tenants = Tenants(iso, groups)
    result = iso.out("gang")
    tenants.backend.launch(tenants.launch("gang", tenants.run("gang", result, None), "pt-a", workers=2))
    ranks = [read_out(f"{result}.{rank}") for rank in (0, 1)]
    assert ranks[1]["note"] == "from rank 0", ranks
    assert ranks[0]["shm_dev"] == ranks[1]["shm_dev"] != os.stat("/dev/shm").st_dev
    seen = wait_for(tenants.backend, ended("gang"))
    assert only(seen, "gang", K.EXITED).exit_code == 0
    wait_until(lambda: not mounts_of_device(ranks[0]["shm_dev"]), timeout=5, what="the gang's tmpfs to go")


def test_an_attempt_that_ended_while_the_control_plane_was_down_is_freed_at_adoption(
    iso: Isolated, groups: cg.Cgroups
) -> None:
    tenants = Tenants(iso, groups)
    result, trigger = iso.out("kept"), iso.shared / "kept-go"
    name = f"gpufleet-test-{secrets.token_hex(3)}"
    launch = tenants.launch("kept", tenants.run("shm", result, trigger, name, "16"), "pt-a")
    tenants.backend.launch(launch)
    found = read_out(result)
    wait_for(tenants.backend, has("kept", K.STARTED))
    tenants.backend.shutdown(stop_jobs=False, grace_s=0)  # the control plane goes; the job runs on
    trigger.touch()
    wait_until(lambda: Path(worker_dir(tenants, "kept") / "exit.json").exists(), what="the job to end")
    assert mounts_of_device(found["shm_dev"])  # nobody has freed it yet
    second = iso.backend(tenants.isolation())
    second.adopt([launch])
    seen = wait_for(second, ended("kept"))
    assert only(seen, "kept", K.EXITED).exit_code == 0
    wait_until(lambda: not mounts_of_device(found["shm_dev"]), timeout=5, what="the attempt's tmpfs to go")


def test_a_crashed_runs_leftover_tmpfs_is_swept_at_start(iso: Isolated, groups: cg.Cgroups) -> None:
    tenants = Tenants(iso, groups)
    leftover = tenants.backend.layout.attempt_tmp("gone", 3)
    tenants.tmp_root.mkdir(mode=0o700, exist_ok=True)
    namespaces.attempt_tmp(str(leftover), 8 * MiB)
    (leftover / "shm" / "data").write_bytes(b"x" * MiB)
    dev = os.stat(leftover).st_dev
    restarted = iso.backend(tenants.isolation())
    restarted.adopt([])
    assert not mounts_of_device(dev)
    assert not leftover.exists()


def test_a_tmpfs_mounted_without_its_folders_by_a_killed_control_plane_is_made_whole(
    iso: Isolated, groups: cg.Cgroups
) -> None:
    """kill -9 between the attempt's tmpfs mount and its `tmp/` and `shm/`: the next start finds the tmpfs mounted
    and must still give the worker a /tmp and /dev/shm it can write (it once failed with 'mount bind on /dev/shm:
    No such file or directory')."""
    tenants = Tenants(iso, groups)
    half = tenants.backend.layout.attempt_tmp("half", 1)
    tenants.tmp_root.mkdir(mode=0o700, exist_ok=True)
    namespaces.attempt_tmp(str(half), 8 * MiB)
    (half / "shm").rmdir()
    (half / "tmp").chmod(0o700)  # made, but killed before its mode was set
    result, name = iso.out("half"), f"gpufleet-test-{secrets.token_hex(3)}"
    restarted = iso.backend(tenants.isolation())
    restarted.launch(tenants.launch("half", tenants.run("shm", result, None, name, "1"), "pt-a"))
    seen = wait_for(restarted, ended("half"))
    assert only(seen, "half", K.EXITED).exit_code == 0, seen
    found = read_out(result)
    assert (found["written"], found["error"]) == (1, None)
    assert found["shm_dev"] == found["tmp_dev"] != os.stat("/dev/shm").st_dev


def test_a_working_folder_under_tmp_is_refused_with_the_reason(iso: Isolated, groups: cg.Cgroups) -> None:
    tenants = Tenants(iso, groups)
    # The folder exists in the host's /tmp, not in the job's.
    run = RunSpec(("/bin/true",), workdir="/tmp/gpufleet-not-in-the-job")
    Path(run.workdir).mkdir(exist_ok=True)
    try:
        tenants.backend.launch(tenants.launch("wd", run, "pt-a"))
        seen = wait_for(tenants.backend, ended("wd"))
    finally:
        Path(run.workdir).rmdir()
    detail = only(seen, "wd", K.EXITED).detail
    assert "working folder" in detail, detail
    assert "private /tmp" in detail, detail


def test_without_the_sandbox_the_isolation_report_says_so(iso: Isolated) -> None:
    require_root()
    report = Isolation.detect(iso.state, jobs_home=iso.jobs_home, sandbox=False).report()
    said = " ".join(report.notes)
    assert "/tmp and /dev/shm are shared by every job" in said, report
    assert "command line" in said, report
    on = Isolation.detect(iso.state, jobs_home=iso.jobs_home).report()
    assert "private /tmp and /dev/shm" in on.users, on
    assert "own user's processes" in on.users, on
    assert not any("/tmp" in note for note in on.notes), on


def worker_dir(tenants: Tenants, job_id: str, rank: int = 0) -> Path:
    return tenants.backend.layout.worker_dir(job_id, 1, rank)


@pytest.mark.slow
def test_on_gpufleet_up_a_job_reads_no_other_process_and_has_a_tmp_of_its_own(tmp_path: Path) -> None:
    require_root()
    with users_created_here():
        live = start(tmp_path)
        try:
            program = share(live.shared / "tenant.py", TENANT)
            result = str(live.shared / "ps.json")
            plane = str(live.server.process.pid)  # `gpufleet up` itself, as root: its command line names its data
            command = [JOB_PYTHON, str(program), "ps", result, "-", "1", plane]
            with live.http() as client:
                answer = client.post("/v1/jobs", json={"queue": "default", "command": command})
                assert answer.status_code == 201, answer.text
                job = live.wait_state(client, answer.json()["id"], "succeeded", "failed")
            found = read_out(result)
            output = live.server.output()
        finally:
            live.server.stop()
    assert job["state"] == "succeeded", job
    assert found["cmdlines"] == {"1": "absent", plane: "absent"}, found
    assert set(found["procs"].values()) == {found["uid"]}, found["procs"]
    assert found["tmp_dev"] != os.stat("/tmp").st_dev
    assert found["shm_dev"] != os.stat("/dev/shm").st_dev
    assert "each attempt has a private /tmp and /dev/shm" in output
    assert "a job sees only its own user's processes" in output
    assert not [m for m in namespaces.attempt_mounts() if m.startswith(str(tmp_path))]  # nothing left behind


@pytest.mark.slow
def test_gpufleet_up_with_shared_tmp_says_jobs_share_tmp_and_proc(tmp_path: Path) -> None:
    require_root()
    with users_created_here():
        live = start(tmp_path, "--shared-tmp")
        try:
            output = live.server.output()
        finally:
            live.server.stop()
    assert "/tmp and /dev/shm are shared by every job on the node: turned off with --shared-tmp" in output
    assert "every job can read every process's command line" in output
    assert "each attempt has a private /tmp" not in output


def test_a_worker_starts_while_another_attempts_tmpfs_is_being_released(tmp_path: Path) -> None:
    # A worker's namespace starts with a copy of the host's mounts, other attempts' tmpfs among them, and
    # detaches those; one whose attempt ended meanwhile is gone (EINVAL) or out of reach (ENOENT), and the
    # worker must start all the same (it failed "cannot give it a private /tmp …: No such file or directory"
    # when many short jobs started and ended at once).
    require_root()
    released = tmp_path / "released"
    released.mkdir()
    namespaces._detach_other(str(tmp_path / "removed"))  # ENOENT: its mount point is gone on the host
    namespaces._detach_other(str(released))  # EINVAL: no longer a mount point here
    with pytest.raises(OSError, match="unmount"):
        namespaces._detach_other("/" + "x" * 5000)  # anything else (here ENAMETOOLONG) is still an error
