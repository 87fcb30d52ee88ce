"""Process and file helpers shared by the local backend and its shim: stdlib only, so the shim starts fast.

A pid alone does not name a process: pids are reused. A process is named by its pid and its start time
(`start_ticks`, clock ticks since boot from /proc on Linux), and a recorded process is alive only when a
process with that pid and that start time exists and is not a zombie.
"""

from __future__ import annotations

import json
import os

# The shim imports this module on every launch: `typing` and `pathlib` alone would add ~15 ms to its start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from _typeshed import StrPath

_HAVE_PROC = os.path.isdir("/proc/self")


def start_ticks(pid: int) -> int | None:
    """The start time of a running process (not a zombie), or None when there is no such process."""
    stat = _stat(pid)
    return None if stat is None or stat[1] else stat[0]


def is_running(pid: int | None, ticks: int | None) -> bool:
    """Whether the process recorded as (pid, start ticks) still runs. A zombie child of ours with that start
    time is reaped (the backend object that started it may be gone), and counts as ended."""
    if pid is None or pid <= 0:
        return False
    stat = _stat(pid)
    if stat is None or (ticks is not None and stat[0] != ticks):
        return False
    if stat[1]:
        try:  # noqa: SIM105 - contextlib would cost the shim an import
            os.waitpid(pid, os.WNOHANG)
        except OSError:  # not our child: its own parent reaps it
            pass
        return False
    return True


def _stat(pid: int) -> tuple[int, bool] | None:
    """(start ticks, is a zombie) of a process, or None when there is none."""
    if not _HAVE_PROC:  # pragma: no cover - Linux is the supported platform
        return _stat_psutil(pid)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields after it follow the last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19]), fields[0] in (b"Z", b"X")


def _stat_psutil(pid: int) -> tuple[int, bool] | None:  # pragma: no cover - Linux is the supported platform
    """Where /proc is missing: psutil's create time in milliseconds stands for the start ticks."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return round(proc.create_time() * 1000), proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return None


def write_json(path: StrPath, data: dict[str, Any]) -> None:
    """Write atomically: readers see the whole file or none (tmp file in the same folder, then rename)."""
    folder, name = os.path.split(os.fspath(path))
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_json(path: StrPath) -> dict[str, Any] | None:
    """The file's object, or None when it is missing or unreadable (an interrupted writer leaves no file)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def exit_code(returncode: int) -> int:
    """A shell's exit code: a process killed by signal N ends with 128 + N."""
    return 128 - returncode if returncode < 0 else returncode
