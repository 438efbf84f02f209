"""``rankscope …`` in a child process, with that child's own peak memory.

The peak is the child's VmHWM (the high-water mark of the memory it exec'd into), which it writes
to stderr at exit. Not wait4's ``ru_maxrss``: on Linux that starts from the parent's RSS at the
fork, so inside a full test run (the pytest process at ~1.5 GiB) a 190 MiB command read 1.5 GiB.
"""

from __future__ import annotations

import subprocess
import sys

_REPORT_PEAK = """
import atexit, runpy, sys
def peak():
    kb = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    sys.stderr.write(f"\\nVmHWM {kb}\\n")
atexit.register(peak)
sys.argv[0] = "rankscope"
runpy.run_module("collector.tools.cli", run_name="__main__")
"""


def run_cli(*args: str, env: dict | None = None, timeout: float = 300) -> tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak RSS in bytes) of ``rankscope ARGS`` run in a child."""
    done = subprocess.run(
        [sys.executable, "-c", _REPORT_PEAK, *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    err, _, kb = done.stderr.rpartition("\nVmHWM ")
    return done.returncode, done.stdout, err, int(kb) * 1024
