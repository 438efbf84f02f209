"""A real slow directory: a FUSE passthrough of SOURCE mounted at MOUNT whose every fsync (of a file
or a directory) first sleeps a seeded uniform(MIN, MAX) s, as a network filesystem that stalls its
commits. Unlike collector.testing.slow_fsync (the collector's own ``os.fsync`` wrapped), whatever
syncs a file there waits: the collector's segments, its ledger and manifests, the catalog; reads and
writes go through this process too, so they also cost a round trip through the kernel to it.

    python -m collector.testing.slow_dir SOURCE MOUNT MIN MAX SEED     # runs until unmounted

Needs libfuse 2 (Debian: ``apt-get install libfuse2``) and fusepy (``pip install fusepy``), and
permission to mount (root, or fusermount). ``umount MOUNT`` (or ``fusermount -u MOUNT``) ends it.
"""

from __future__ import annotations

import errno
import os
import random
import sys
import threading
import time

try:
    from fuse import FUSE, FuseOSError, Operations
except (ImportError, OSError) as exc:  # fusepy missing, or libfuse.so.2 missing under it
    FUSE = None
    MISSING = f"a slow directory needs fusepy and libfuse 2 (pip install fusepy; apt-get install libfuse2): {exc}"
    Operations = object
else:
    MISSING = None


class SlowSync(Operations):
    """Every call passed to SOURCE as is, but fsync and fsyncdir, which sleep first."""

    def __init__(self, source: str, low: float, high: float, seed: int) -> None:
        self.source, self.low, self.high = os.path.realpath(source), low, high
        self.rng, self._lock = random.Random(seed), threading.Lock()
        self.syncs = 0

    def _path(self, path: str) -> str:
        return os.path.join(self.source, path.lstrip("/"))

    def _stall(self) -> None:
        with self._lock:
            delay = self.rng.uniform(self.low, self.high)
            self.syncs += 1
        time.sleep(delay)

    def __call__(self, op, path, *args):
        try:
            return super().__call__(op, self._path(path), *args)
        except OSError as exc:
            raise FuseOSError(exc.errno or errno.EIO) from None

    # the calls the collector, DuckDB and a reader make
    def access(self, path, mode):
        if not os.access(path, mode):
            raise FuseOSError(errno.EACCES)

    def chmod(self, path, mode):
        return os.chmod(path, mode)

    def chown(self, path, uid, gid):
        return os.chown(path, uid, gid)

    def create(self, path, mode, fi=None):
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def flush(self, path, fh):
        return 0  # close(2) of a dup: nothing to commit

    def fsync(self, path, datasync, fh):
        self._stall()
        return os.fdatasync(fh) if datasync else os.fsync(fh)

    def fsyncdir(self, path, datasync, fh):
        self._stall()
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return 0

    def getattr(self, path, fh=None):
        st = os.lstat(path)
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid", "st_ino")
        return {key: getattr(st, key) for key in keys}

    def link(self, target, source):  # fusepy passes (new name, existing): both under SOURCE
        return os.link(self._path(source), target)

    def mkdir(self, path, mode):
        return os.mkdir(path, mode)

    def open(self, path, flags):
        return os.open(path, flags)

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(path)]

    def readlink(self, path):
        return os.readlink(path)

    def release(self, path, fh):
        return os.close(fh)

    def rename(self, old, new):
        return os.rename(old, self._path(new))

    def rmdir(self, path):
        return os.rmdir(path)

    def statfs(self, path):
        st = os.statvfs(path)
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag")
        return {key: getattr(st, key) for key in (*keys, "f_frsize", "f_namemax")}

    def symlink(self, target, source):
        return os.symlink(source, target)

    def truncate(self, path, length, fh=None):  # 0, not the new length: FUSE reads a result as an error code
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(path, length)
        return 0

    def unlink(self, path):
        return os.unlink(path)

    def utimens(self, path, times=None):
        return os.utime(path, times)

    def write(self, path, data, offset, fh):
        return os.pwrite(fh, data, offset)


def main(argv: list[str]) -> int:
    if MISSING:
        print(f"rankscope: {MISSING}", file=sys.stderr)
        return 2
    source, mount, low, high, seed = argv
    # use_ino: the real inode numbers (a hard link is the same file to DuckDB and the ledger)
    FUSE(SlowSync(source, float(low), float(high), int(seed)), mount, foreground=True, nothreads=False, use_ino=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
