"""Whether the collector can write its data dir, told where people look: its log, /metrics
(``rankscope_collector_write_failing``, ``rankscope_collector_commit_failures_total``) and
``rankscope health`` (which reads ``D/collector-status.json``).

When a commit fails (a full disk, a read-only or vanished mount) nothing of it is acknowledged:
the ranks keep their records (memory, then spool) and resend them, and each resend tries the
disk again, so the collector resumes by itself once space returns. The failure is said once
when it begins ("collector cannot write: disk full ...") and once when it ends, not per commit.

The status file has to be written when the disk is full, so it is made at start-up at a fixed
size (``SIZE`` bytes, padded with spaces) and afterwards only overwritten in place: no new block
is needed. A reader may catch it mid-overwrite; ``read`` then returns None (it is only a report).
A collector that stops removes it; one that was killed leaves it, and ``note`` then says that the
last collector (no longer running) could not write.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

log = logging.getLogger("rankscope.collector")

FILE_NAME = "collector-status.json"
SIZE = 1024
_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def reason(exc: BaseException) -> str:
    """What people should read: "disk full" for ENOSPC/EDQUOT, else the error."""
    for e in (exc, exc.__cause__, exc.__context__):
        if isinstance(e, OSError) and e.errno in _FULL:
            return "disk full"
    text = str(exc) or type(exc).__name__
    return ("disk full" if "No space left on device" in text else text)[:300]


class WriteStatus:
    """One collector's write health; ``failed``/``succeeded`` are called after each commit."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / FILE_NAME
        self.failing: str | None = None  # why commits fail now
        self.since: float | None = None  # wall time the failure began
        self.failures = 0  # commits that failed, since start
        self._failed_in_episode = 0
        self._lock = threading.Lock()
        try:  # reserve the file's blocks now, while there is room
            self.path.write_text(" " * SIZE)
            self._write()
        except OSError as e:
            log.warning("cannot reserve %s (%s): rankscope health will not see write failures", self.path, e)

    def failed(self, exc: BaseException, envelopes: int) -> None:
        why = reason(exc)
        with self._lock:
            self.failures += 1
            self._failed_in_episode += 1
            first = self.failing is None
            self.failing, self.since = why, self.since or time.time()
        if first:
            free = _free_bytes(self.data_dir)
            log.error(
                "collector cannot write: %s (data dir %s%s); %d envelope(s) not acknowledged: the ranks keep them "
                "(memory, then spool) and resend, and the collector takes them once it can write again",
                why,
                self.data_dir,
                f", {free:,} bytes free" if free is not None else "",
                envelopes,
                exc_info=why != "disk full",  # an unexpected failure gets its traceback
            )
            self._write()

    def succeeded(self) -> None:
        if self.failing is None:
            return
        with self._lock:
            was, since, n = self.failing, self.since, self._failed_in_episode
            self.failing, self.since, self._failed_in_episode = None, None, 0
        log.warning(
            "collector can write again (it could not for %.0f s: %s; %d commit(s) failed, nothing of them was "
            "acknowledged, and the ranks' resends are being stored)",
            time.time() - (since or time.time()),
            was,
            n,
        )
        self._write()

    def close(self) -> None:
        """The collector stops: nothing to report any more (a data dir at rest holds no status file)."""
        self.path.unlink(missing_ok=True)

    def _write(self) -> None:
        body = json.dumps({"pid": os.getpid(), "failing": self.failing, "since": self.since, "updated": time.time()})
        data = body.encode().ljust(SIZE)[:SIZE]
        try:
            fd = os.open(self.path, os.O_WRONLY)
            try:
                os.pwrite(fd, data, 0)  # in place: the blocks are there already
            finally:
                os.close(fd)
        except OSError as e:
            log.debug("cannot update %s: %s", self.path, e)


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def read(data_dir) -> dict | None:
    try:
        status = json.loads((Path(data_dir) / FILE_NAME).read_text().strip() or "null")
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def note(data_dir) -> str | None:
    """For ``rankscope health``: a line while the data dir's collector cannot write."""
    status = read(data_dir)
    if not status or not status.get("failing"):
        return None
    pid, since = status.get("pid"), status.get("since")
    alive = isinstance(pid, int) and _alive(pid)
    when = time.strftime("%H:%M:%S UTC", time.gmtime(since)) if isinstance(since, (int, float)) else "?"
    who = "collector" if alive else f"the last collector (pid {pid}, no longer running here)"
    return (
        f"{who} cannot write: {status['failing']} (since {when}, data dir {data_dir}): "
        "nothing new is stored or acknowledged until it can; the ranks keep their records and resend them"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
