"""A private PostgreSQL server for tests: `initdb` and `pg_ctl` in a temporary folder, on 127.0.0.1 and a
free port, trust authentication, durability off (tests do not survive power loss anyway).

initdb refuses to run as root, so as root the server runs as the `postgres` user (`runuser`), its data
folder chowned to it. Each test gets its own database (`create_database`), so tests never see each
other's rows.

Missing binaries are an error, not a skip: install Debian's `postgresql` package. Only
`GPUFLEET_TEST_POSTGRES=0` turns the PostgreSQL tests off (they are then reported as skipped).
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg

OPT_OUT = "GPUFLEET_TEST_POSTGRES"
INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl) were not found on PATH nor in /usr/lib/postgresql/*/bin; "
    "to fix: install Debian's `postgresql` package (apt-get install postgresql), as CI does, "
    f"or set {OPT_OUT}=0 to skip the PostgreSQL tests"
)


class PostgresUnavailableError(RuntimeError):
    pass


def opted_out() -> bool:
    return os.environ.get(OPT_OUT, "1").strip().lower() in ("0", "false", "no", "off")


def find_bin_dir() -> Path:
    """The folder holding initdb and pg_ctl: PATH first, then the newest /usr/lib/postgresql/<v>/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
    )
    for folder in reversed(candidates):
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    raise PostgresUnavailableError(INSTALL_HINT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One running server; `url(db)` gives a SQLAlchemy URL, `create_database()` a fresh database."""

    def __init__(self) -> None:
        self.bin_dir = find_bin_dir()
        self.as_root = os.geteuid() == 0
        # Not under pytest's tmp_path: that lies in a root-only folder the postgres user cannot enter.
        self.root = Path(tempfile.mkdtemp(prefix="gpufleet-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0
        self._names = itertools.count(1)
        self._started = False

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / argv[0]), *argv[1:]]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    def start(self) -> None:
        self.data.mkdir()
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
            shutil.chown(self.data, "postgres", "postgres")
        done = self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        if done.returncode != 0:
            raise PostgresUnavailableError(f"initdb failed:\n{done.stdout}\n{done.stderr}")
        for _attempt in range(3):  # the free port may be taken between choosing and binding it
            self.port = _free_port()
            options = (
                f"-h 127.0.0.1 -p {self.port} -k {self.data} -F "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
            )
            done = self._run(
                "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "30", "start"
            )
            if done.returncode == 0:
                self._started = True
                return
        log = self.log.read_text() if self.log.exists() else ""
        raise PostgresUnavailableError(f"pg_ctl start failed:\n{done.stdout}\n{done.stderr}\n{log[-2000:]}")

    def stop(self) -> None:
        if self._started:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self._started = False
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, template: str | None = None) -> str:
        """A new database, empty or a copy of the database `template` (nobody may be connected to it);
        returns its URL. Copying a small database is faster than creating one from `template1`."""
        name = f"t{os.getpid()}_{next(self._names)}"
        copy = f' TEMPLATE "{template}"' if template else ""
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"{copy}')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as c,
        ):
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
