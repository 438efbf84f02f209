"""A small, fillable disk for a test of what a full disk does: a tmpfs mounted on a folder (root
only), unmounted on the way out (lazily: a process still holding a file there does not keep it).

    with disks.small_disk(tmp_path / "disk", "8m") as disk:   # DiskUnavailable: why not here
        (disk / "filler").touch()      # made first: on a full tmpfs not even a new name fits
        disks.fill(disk / "filler")    # every free byte taken
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


class DiskUnavailable(RuntimeError):
    """No tmpfs can be mounted here (not root, or the mount refused): the test skips with this."""


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """``folder`` (created) with a tmpfs of ``size`` (mount's syntax: 64k, 8m) on it."""
    if os.geteuid() != 0:
        raise DiskUnavailable("needs root to mount a small tmpfs")
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        raise DiskUnavailable(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(path: Path, chunk: int = 4096) -> Path:
    """Appends to ``path`` until its disk takes no more (the open itself may already find no room)."""
    try:
        with open(path, "ab") as f:
            block = b"\0" * chunk
            while True:
                f.write(block)
                f.flush()
    except OSError:
        pass
    return path
