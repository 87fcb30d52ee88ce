"""Workers isolated as `gpufleet up` as root isolates them: each queue's own OS user, a clean environment, a
private working folder and log, and a cgroup per worker (memory, CPU, pids, GPU devices, whole-cgroup kill).
Real users (created by the executor and removed after), real cgroups, real processes."""

from __future__ import annotations

import os
import pwd
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.adapters.local import cgroups as cg
from gpufleet.adapters.local.executor import people_size
from gpufleet.adapters.local.isolation import Isolation
from gpufleet.adapters.local.proc import read_json
from gpufleet.adapters.local.users import queue_user
from gpufleet.domain import GiB
from gpufleet.domain.jobs import RunSpec
from gpufleet.ports import Launch, ObservationKind
from tests.kit.jobusers import JOB_PYTHON
from tests.local.conftest import ended, has, only, wait_for, wait_until
from tests.local.isolation_kit import (
    Isolated,
    isolated_setup,
    pid_alive,
    read_out,
    require_cgroups,
    require_root,
)

K = ObservationKind
MiB = 1 << 20


@pytest.fixture
def iso(tmp_path: Path) -> Iterator[Isolated]:
    with isolated_setup(tmp_path) as iso:
        yield iso


@pytest.fixture(scope="module")
def groups() -> cg.Cgroups:
    return require_cgroups("test-iso")


@pytest.fixture
def mapped_user(iso: Isolated) -> Iterator[str]:
    """An unprivileged user (with a home) an administrator could map a queue to."""
    require_root()
    name = "gft-mapped"
    subprocess.run(["userdel", name], capture_output=True, check=False)
    home = ["--create-home", "--home-dir", str(iso.shared / "mapped-home")]
    subprocess.run(["useradd", "--system", "--user-group", *home, name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True, check=False)
        subprocess.run(["userdel", name], capture_output=True, check=False)


def test_each_queue_runs_as_its_own_user_in_a_clean_environment_and_private_folder(
    iso: Isolated, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_root()
    monkeypatch.setenv("OPERATOR_SECRET", "s3cret")  # in the control plane's environment only
    backend = iso.backend(iso.per_queue_users())
    out_a, out_b = iso.out("a"), iso.out("b")
    backend.launch(iso.launch("a", iso.run("whoami", out_a, env=(("MINE", "1"),)), queue="iso-a"))
    backend.launch(iso.launch("b", iso.run("whoami", out_b), queue="iso-b"))
    seen = wait_for(backend, lambda seen: ended("a")(seen) and ended("b")(seen))
    assert only(seen, "a", K.EXITED).exit_code == 0, seen
    a, b = read_out(out_a), read_out(out_b)
    user_a, user_b = pwd.getpwnam("gpufleet-iso-a"), pwd.getpwnam("gpufleet-iso-b")
    # Each queue its own unprivileged user, never the control plane's.
    assert (a["uid"], b["uid"]) == (user_a.pw_uid, user_b.pw_uid)
    assert 0 not in (a["uid"], a["gid"], *a["groups"])
    assert a["uid"] != b["uid"]
    assert user_a.pw_dir == str(iso.jobs_home / "gpufleet-iso-a")
    assert stat.S_IMODE(os.stat(user_a.pw_dir).st_mode) == 0o700
    # A clean environment: the base, the job's own, the allocator's; nothing of the control plane's.
    env = a["env"]
    assert "OPERATOR_SECRET" not in env
    assert (env["USER"], env["LOGNAME"], env["HOME"]) == ("gpufleet-iso-a", "gpufleet-iso-a", user_a.pw_dir)
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert env["LANG"] == "C.UTF-8"
    assert env["MINE"] == "1"
    assert env["GPUFLEET_JOB_ID"] == "a"
    allocator = ("CUDA_", "NVIDIA_", "GPUFLEET_", "MASTER_", "WORLD_", "RANK", "LOCAL_", "NODE_")
    base = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "MINE", "PWD"}
    assert {k for k in env if not k.startswith(allocator)} <= base
    # Its working folder is in its user's home, its own and private; a job's umask is the usual one.
    assert a["cwd"] == os.path.join(user_a.pw_dir, "gpufleet-jobs", "a")
    assert (a["cwd_uid"], a["cwd_mode"], a["umask"]) == (user_a.pw_uid, 0o700, 0o022)
    # Its log is the control plane's, readable by its own user's group only.
    log = backend.log_paths("a")[0]
    info = log.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, user_a.pw_gid, 0o640)
    # The executor's state folder (records, other jobs' logs and environments) is private.
    assert stat.S_IMODE(iso.state.stat().st_mode) == 0o700


def test_a_job_cannot_read_another_queues_files_logs_or_the_executors_state(iso: Isolated) -> None:
    require_root()
    backend = iso.backend(iso.per_queue_users())
    trigger = iso.shared / "go"
    backend.launch(
        iso.launch("secret-b", iso.run("wait", str(trigger), "0", env=(("B_TOKEN", "b-secret"),)), queue="iso-b")
    )
    wait_for(backend, has("secret-b", K.STARTED))
    home_b = pwd.getpwnam("gpufleet-iso-b").pw_dir
    b_log = backend.log_paths("secret-b")[0]
    spec_b = iso.state / "run" / "secret-b" / "attempt-1" / "worker-0" / "spec.json"  # holds b's environment
    targets = [home_b, f"{home_b}/gpufleet-jobs/secret-b", str(b_log), str(spec_b), str(iso.state), "/root"]
    out = iso.out("reads")
    backend.launch(iso.launch("nosy-a", iso.run("try-read", out, *targets), queue="iso-a"))
    wait_for(backend, ended("nosy-a"))
    found = read_out(out)
    assert found == dict.fromkeys(targets, "denied"), found
    trigger.touch()
    assert only(wait_for(backend, ended("secret-b")), "secret-b", K.EXITED).exit_code == 0


def test_a_mapped_user_is_used_and_root_or_a_missing_user_is_refused(iso: Isolated, mapped_user: str) -> None:
    backend = iso.backend(iso.per_queue_users())
    out = iso.out("mapped")
    backend.launch(iso.launch("m", iso.run("whoami", out), run_as=mapped_user))
    backend.launch(iso.launch("r", iso.run("whoami", iso.out("root")), run_as="root"))
    backend.launch(iso.launch("x", iso.run("whoami", iso.out("x")), run_as="nobody-here"))
    seen = wait_for(backend, lambda seen: all(ended(j)(seen) for j in ("m", "r", "x")))
    assert read_out(out)["uid"] == pwd.getpwnam(mapped_user).pw_uid
    root = only(seen, "r", K.EXITED)
    assert root.exit_code == 126
    assert "root's uid 0" in root.detail
    assert "to fix" in root.detail
    missing = only(seen, "x", K.EXITED)
    assert "'nobody-here' does not exist" in missing.detail
    assert "'nobody-here' does not exist" in backend.log_paths("x")[0].read_text()  # said in its log too


def test_a_home_left_by_an_earlier_user_of_the_same_name_is_given_back_and_its_jobs_run(iso: Isolated) -> None:
    """A queue's user removed and made again gets another uid; its home and working folders, still the old
    uid's, made every job fail "Permission denied" on its working folder."""
    backend = iso.backend(iso.per_queue_users())
    backend.launch(iso.launch("first", iso.run("whoami", iso.out("first")), queue="iso-a"))
    assert only(wait_for(backend, ended("first")), "first", K.EXITED).exit_code == 0
    user = pwd.getpwnam("gpufleet-iso-a")
    home = Path(user.pw_dir)
    old = user.pw_uid + 1000  # the uid the user had before it was removed and made again
    elsewhere = iso.shared / "not-the-homes.txt"
    elsewhere.write_text("someone else's")
    os.link(elsewhere, home / "hard-link")  # a second name, made by the old owner, for a file outside
    for folder, _, files in os.walk(home):
        for path in (folder, *(os.path.join(folder, name) for name in files)):
            os.lchown(path, old, old)
    os.symlink("/etc/hostname", home / "to-etc")
    backend.launch(iso.launch("again", iso.run("whoami", out := iso.out("again")), queue="iso-a"))
    assert only(wait_for(backend, ended("again")), "again", K.EXITED).exit_code == 0
    assert read_out(out)["uid"] == user.pw_uid
    assert (home.stat().st_uid, (home / "gpufleet-jobs" / "first").stat().st_uid) == (user.pw_uid, user.pw_uid)
    assert elsewhere.stat().st_uid == old  # a hard link's file keeps its owner
    assert os.stat("/etc/hostname").st_uid == 0  # a link is not followed


def test_queue_names_that_are_not_user_names_get_distinct_valid_users() -> None:
    names = {q: queue_user(q) for q in ("team-a", "Team-A", "team.a", "a" * 63, "b" * 63, "9lives", "_x")}
    assert names["team-a"] == "gpufleet-team-a"
    assert len(set(names.values())) == len(names)
    for user in names.values():
        assert len(user) <= 32
        assert user.startswith("gpufleet-")
        assert user == user.lower()


# --- cgroups ----------------------------------------------------------------------------------------------


def test_a_worker_over_its_memory_limit_ends_with_out_of_memory_in_peoples_units(
    iso: Isolated, groups: cg.Cgroups
) -> None:
    if "memory" not in groups.controls:
        pytest.fail(f"the memory controller should work here: {groups.describe()}")
    backend = iso.backend(iso.per_queue_users(groups))
    backend.launch(iso.launch("hog", iso.run("hog", "512"), memory=64 * MiB))
    backend.launch(iso.launch("small", iso.run("hog", "8"), memory=256 * MiB))
    seen = wait_for(backend, lambda seen: ended("hog")(seen) and ended("small")(seen), timeout=30)
    hog = only(seen, "hog", K.EXITED)
    assert hog.exit_code == 137
    assert "out of memory (limit 64 MiB)" in hog.detail
    assert only(seen, "small", K.EXITED).exit_code == 0
    assert people_size(16 * GiB) == "16 GiB"


def test_cpu_quota_and_pids_limit_hold(iso: Isolated, groups: cg.Cgroups) -> None:
    for control in ("cpu", "pids"):
        if control not in groups.controls:
            pytest.fail(f"the {control} controller should work here: {groups.describe()}")
    backend = iso.backend(iso.per_queue_users(groups, pids_limit=16))
    spun, forked = iso.out("spin"), iso.out("fork")
    backend.launch(iso.launch("spin", iso.run("spin", "1.5", spun), cpu_milli=200))
    backend.launch(iso.launch("forks", iso.run("fork", "40", forked)))
    wait_for(backend, has("spin", K.STARTED))
    folder = Path(groups.bases["cpu"]) / "spin.1.0"
    assert (folder / "cpu.cfs_quota_us").read_text().strip() == "20000"  # 0.2 of each 100 ms period
    seen = wait_for(backend, lambda seen: ended("spin")(seen) and ended("forks")(seen), timeout=30)
    assert only(seen, "spin", K.EXITED).exit_code == 0
    assert read_out(spun)["cpu"] < 0.2 * 1.5 + 0.25  # a fifth of a core (plus start-up), not a whole one
    assert read_out(forked)["started"] < 16  # the limit counts the worker's own process too


def test_a_worker_opens_only_its_own_gpus_devices(iso: Isolated, groups: cg.Cgroups) -> None:
    if "devices" not in groups.controls:
        if groups.version == "v2":
            pytest.skip(f"cgroup v2 only: {cg.V2_DEVICES_NOTE}")
        pytest.fail(f"the devices controller should work here: {groups.describe()}")
    dev = iso.shared / "dev"
    dev.mkdir()
    nodes = {f"nvidia{n}": (195, n) for n in range(8)}
    nodes |= {
        "nvidiactl": (195, 255),
        "nvidia-modeset": (195, 254),
        "nvidia-uvm": (235, 0),
        "nvidia-uvm-tools": (235, 1),
    }
    for name, (major, minor) in nodes.items():
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(dev / name, 0o666)
    paths = [str(dev / name) for name in nodes]
    backend = iso.backend(iso.per_queue_users(groups))
    out, out_none = iso.out("dev"), iso.out("none")
    backend.launch(iso.launch("two", iso.run("devices", out, *paths), gpus=(2, 5)))
    backend.launch(iso.launch("none", iso.run("devices", out_none, *paths), gpus=()))
    wait_for(backend, lambda seen: ended("two")(seen) and ended("none")(seen))
    opened = {Path(p).name: e for p, e in read_out(out).items()}
    # No driver here: a device the cgroup lets through opens as far as the driver (ENXIO); the others never
    # get there (EPERM).
    allowed = {"nvidia2", "nvidia5", "nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"}
    assert {n for n, e in opened.items() if e == "ENXIO"} == allowed, opened
    assert {n for n, e in opened.items() if e == "EPERM"} == set(nodes) - allowed
    blocked = {Path(p).name for p, e in read_out(out_none).items() if e == "EPERM"}
    assert blocked == {f"nvidia{n}" for n in range(8)}


@pytest.mark.parametrize("grace_s", [0.5, 0.0], ids=["with-grace", "forced"])
def test_a_stop_kills_processes_that_left_the_workers_session(
    iso: Isolated, groups: cg.Cgroups, grace_s: float
) -> None:
    backend = iso.backend(iso.per_queue_users(groups))
    pidfile = iso.shared / "escapee.pid"
    backend.launch(iso.launch("escape", iso.run("escape", str(pidfile))))
    wait_for(backend, has("escape", K.STARTED))
    wait_until(pidfile.exists, what="the escapee's pid")
    escapee = int(pidfile.read_text())
    assert os.getsid(escapee) != os.getsid(iso_child_pid(iso, "escape"))  # it really left the session
    backend.stop("escape", 1, grace_s, "cancelled by a test")
    if grace_s == 0:
        # cancel --force: SIGKILL without grace reaches the job's process group; what left it dies with the
        # cgroup as soon as the command is gone, with no poll of the backend in between.
        wait_until(lambda: not pid_alive(escapee), timeout=2.0, what="the escapee to die of the forced stop")
    seen = wait_for(backend, ended("escape"))
    assert only(seen, "escape", K.STOPPED).detail == "cancelled by a test"
    assert not pid_alive(escapee)  # it held the job's GPUs: it must not outlive the stop
    assert not any(Path(f).exists() for f in cgroup_folders(groups, "escape"))


def test_leftovers_die_with_the_worker_when_it_exits_by_itself(iso: Isolated, groups: cg.Cgroups) -> None:
    backend = iso.backend(iso.per_queue_users(groups))
    pidfile = iso.shared / "daemon.pid"
    backend.launch(iso.launch("daemon", iso.run("escape", str(pidfile), "exit")))
    seen = wait_for(backend, ended("daemon"))
    assert only(seen, "daemon", K.EXITED).exit_code == 0
    assert not pid_alive(int(pidfile.read_text()))


def test_a_base_cgroup_removed_while_empty_is_made_again_for_the_next_worker(iso: Isolated, groups: cg.Cgroups) -> None:
    backend = iso.backend(iso.per_queue_users(groups))
    bases = list(dict.fromkeys(groups.bases.values()))
    # What a tool that clears empty cgroups does (or another test session's cleanup on a shared machine).
    for base in bases:
        os.rmdir(base)
    backend.launch(iso.launch("again", iso.run("whoami", iso.out("again"))))
    seen = wait_for(backend, ended("again"))
    assert only(seen, "again", K.EXITED).exit_code == 0
    assert all(Path(base).is_dir() for base in bases)


def test_a_worker_whose_cgroup_vanishes_before_it_joins_is_lost_and_retried_not_failed(
    iso: Isolated, groups: cg.Cgroups, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something on the node removed the worker's (still empty) cgroup between its creation and the shim joining
    it: nothing of the job ran, so the attempt is lost (the loop starts the job again), not failed with 127."""
    isolation = iso.per_queue_users(groups)
    backend = iso.backend(isolation)
    made = isolation.prepare

    def prepare_then_vanish(*args: object, **kwargs: object) -> object:
        prepared = made(*args, **kwargs)  # type: ignore[arg-type]
        for folder in prepared.cgroup:
            os.rmdir(folder)
        return prepared

    monkeypatch.setattr(isolation, "prepare", prepare_then_vanish)
    backend.launch(iso.launch("vanish", iso.run("whoami", iso.out("vanish"))))
    seen = wait_for(backend, ended("vanish"))
    lost = only(seen, "vanish", K.LOST)
    assert "cannot join its cgroup" in lost.detail
    assert not Path(iso.out("vanish")).exists()  # the command never ran


def test_after_a_crash_adoption_kills_and_removes_the_cgroup_of_a_lost_or_orphaned_worker(
    iso: Isolated, groups: cg.Cgroups
) -> None:
    first = iso.backend(iso.per_queue_users(groups))
    lost_pid, orphan_pid = iso.shared / "lost.pid", iso.shared / "orphan.pid"
    lost, orphan = (
        iso.launch("lost", iso.run("escape", str(lost_pid))),
        iso.launch("orphan", iso.run("escape", str(orphan_pid))),
    )
    first.launch(lost)
    first.launch(orphan)
    wait_until(lambda: lost_pid.exists() and orphan_pid.exists(), what="both escapees")
    # The control plane dies (no shutdown), and so does one worker's shim.
    shim = int(worker_record(iso, "lost", "shim.pid")["pid"])
    os.kill(shim, signal.SIGKILL)
    wait_until(lambda: not pid_alive(shim), what="the shim to die")
    second = iso.backend(iso.per_queue_users(groups))
    second.adopt([lost])  # the store believes `lost` runs, and knows nothing of `orphan`
    seen = wait_for(second, ended("lost"))
    assert only(seen, "lost", K.LOST).detail == "worker died while the control plane was down"
    for pidfile, job in ((lost_pid, "lost"), (orphan_pid, "orphan")):
        wait_until(lambda p=pidfile: not pid_alive(int(p.read_text())), what=f"{job}'s escapee to be killed")
        # Removed by the executor (a worker whose shim is gone) or by the worker's own shim, moments later.
        wait_until(lambda j=job: no_cgroup(groups, j), timeout=5, what=f"{job}'s cgroup to be removed")


def test_an_adopted_job_ends_normally_and_its_shim_cleans_its_cgroup(iso: Isolated, groups: cg.Cgroups) -> None:
    first = iso.backend(iso.per_queue_users(groups))
    trigger = iso.shared / "go"
    launch = iso.launch("kept", iso.run("wait", str(trigger), "5"), memory=256 * MiB)
    first.launch(launch)
    wait_for(first, has("kept", K.STARTED))
    second = iso.backend(iso.per_queue_users(groups))  # the first control plane died without a word
    second.adopt([launch])
    trigger.touch()
    seen = wait_for(second, ended("kept"))
    assert only(seen, "kept", K.EXITED).exit_code == 5
    assert not any(Path(f).exists() for f in cgroup_folders(groups, "kept"))


def test_cgroup_v2_kills_the_whole_cgroup_and_removes_it(iso: Isolated) -> None:
    require_root()
    mounts = [
        line.split(" - ")[0].split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if " - cgroup2 " in line
    ]
    if not mounts:
        pytest.skip("no cgroup v2 hierarchy is mounted on this machine")
    v2 = cg.at_v2(os.path.join(mounts[0], f"gpufleet-test-{os.getpid()}"))
    assert "eBPF" in v2.describe()  # says plainly that GPU devices are not locked on v2
    backend = iso.backend(Isolation.same_user(cgroups=v2))
    pidfile = iso.shared / "v2.pid"
    backend.launch(iso.launch("v2", iso.run("escape", str(pidfile)), memory=256 * MiB))
    wait_until(pidfile.exists, what="the escapee")
    escapee = int(pidfile.read_text())
    assert f"gpufleet-test-{os.getpid()}/v2.1.0" in Path(f"/proc/{escapee}/cgroup").read_text()
    backend.stop("v2", 1, 0.2, "stop")
    wait_for(backend, ended("v2"))
    assert not pid_alive(escapee)
    assert not Path(v2.bases[""], "v2.1.0").exists()
    os.rmdir(v2.bases[""])


def test_without_cgroups_the_executor_says_so() -> None:
    groups = cg.detect("x", mountinfo="/dev/null")
    if os.geteuid() == 0:
        assert groups.describe().startswith("cgroups unavailable (no cgroup file system is mounted)")
    else:
        assert "not root" in groups.describe()
    assert "survive a stop" in groups.describe()


# --- helpers ------------------------------------------------------------------------------------------------


def worker_record(iso: Isolated, job_id: str, name: str) -> dict[str, Any]:
    record = read_json(iso.state / "run" / job_id / "attempt-1" / "worker-0" / name)
    assert record is not None, f"no {name} for {job_id}"
    return record


def iso_child_pid(iso: Isolated, job_id: str) -> int:
    return int(worker_record(iso, job_id, "child.pid")["pid"])


def cgroup_folders(groups: cg.Cgroups, job_id: str) -> list[str]:
    return groups.folders_for(f"{job_id}.1.0")


def no_cgroup(groups: cg.Cgroups, job_id: str) -> bool:
    return not any(Path(f).exists() for f in cgroup_folders(groups, job_id))


def test_a_checkpoint_in_the_default_working_folder_survives_into_the_next_attempt(iso: Isolated) -> None:
    require_root()
    backend = iso.backend(iso.per_queue_users())
    save = "open('ckpt', 'w').write('epoch 3')"
    first = iso.launch("resume", RunSpec((JOB_PYTHON, "-c", save)))
    backend.launch(first)
    assert only(wait_for(backend, ended("resume")), "resume", K.EXITED).exit_code == 0
    out = iso.out("resumed")
    load = f"import json; json.dump({{'ckpt': open('ckpt').read()}}, open({out!r}, 'w'))"
    second = iso.launch("resume", RunSpec((JOB_PYTHON, "-c", load)))
    backend.launch(Launch(second.job, 2, second.workers))  # preempted, placed again: attempt 2
    assert only(wait_for(backend, ended("resume")), "resume", K.EXITED).exit_code == 0
    assert read_out(out) == {"ckpt": "epoch 3"}
