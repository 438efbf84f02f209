"""Whether a process still runs, from its pid: for files that name their writer by pid (a rank's
spool files, the collector's ``collector.json``). A zombie (exited, not yet reaped) counts as gone:
it writes and listens no more. Linux's /proc answers; without it a pid that exists is taken as alive."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return start_time(pid) != "zombie"


def start_time(pid: int):
    """The process's start time (field 22 of /proc/<pid>/stat), "zombie" for a dead child not
    yet reaped, None where /proc is not there."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    if fields[0] == "Z":
        return "zombie"
    return int(fields[19])
