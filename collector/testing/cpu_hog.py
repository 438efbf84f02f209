"""A CPU hog: ``n`` processes spinning a core each, what "beside other work" means in the
dashboard's load checks (issue 48: every page's first chart beside the demo and a 2-process hog)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time


@contextlib.contextmanager
def cpu_hog(n: int, settle_s: float = 5.0):
    """``n`` processes running ``while True: pass``, killed on exit; ``settle_s`` for the load
    average and the scheduler to see them before the body runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        if n:
            time.sleep(settle_s)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
