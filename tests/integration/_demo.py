"""Starting `rankscope demo` the way the demo tests need it."""

from __future__ import annotations

import subprocess
import sys


def start_demo(data_dir, *flags: str, cwd=None) -> subprocess.Popen:
    """`rankscope demo --data-dir data_dir *flags`, its console merged on stdout, in a process group of
    its own as a terminal's foreground job is: a Ctrl-C sent to the group reaches all of it."""
    return subprocess.Popen(
        [sys.executable, "-m", "collector.tools.cli", "demo", "--data-dir", str(data_dir), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=cwd,
        start_new_session=True,
    )
