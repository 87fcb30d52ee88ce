"""A real, small file system for full-disk tests: an ext4 image of a few MiB, loop-mounted (root only), with no
blocks reserved for root (the control plane runs as root: reserved blocks would hide the full disk from it).
tmpfs is not used: its free-space check is approximate across CPUs, so a full tmpfs still takes a write now
and then."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(folder: Path, mib: int) -> Iterator[Path]:
    """Mount a fresh `mib` MiB ext4 file system on `folder` for as long as the block runs."""
    if os.geteuid() != 0:
        pytest.skip("loop-mounting a small file system needs root")
    mkfs = shutil.which("mkfs.ext4", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if mkfs is None:
        pytest.fail("mkfs.ext4 is missing (Debian: e2fsprogs)")
    image = folder.parent / f"{folder.name}.img"
    with open(image, "wb") as f:
        f.truncate(mib << 20)
    subprocess.run([mkfs, "-q", "-F", "-m", "0", str(image)], check=True, capture_output=True)
    folder.mkdir(exist_ok=True)
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(folder)], capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.fail(f"cannot loop-mount a file system as root: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)
        image.unlink(missing_ok=True)


def fill_up(folder: Path, name: str = "filler") -> None:
    """Take every byte left on `folder`'s file system (as another job's output would). ext4 reserves room for
    what it has not written out yet and gives the rest back once it has: write, flush to disk, and write
    again until nothing more fits, then as many small files as still fit."""
    while _write_until_full(folder / name):
        os.sync()
    for n in range(1000):
        try:
            (folder / f"{name}-{n}").write_bytes(b"z")
            os.sync()
        except OSError:
            break


def _write_until_full(path: Path) -> int:
    written = 0
    with open(path, "ab", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            written += f.write(b"z" * 4096) or 0
    return written
