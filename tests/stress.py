"""`make test-stress`: the timing-sensitive tests (marker ``timing``) again, beside a CPU hog.

    python -m tests.stress [PYTEST ARGS...]      # default: -q -m "timing and not slow" tests

Starts HOGS busy-loop processes (not pinned: they load the whole host, as other jobs on a shared
CI machine do), runs pytest on the selection, and always stops the hogs: on the way out of
``main`` (pytest's exit status is ours), on SIGTERM/SIGINT, and, should this process itself be
killed, by the kernel (each hog asks for SIGKILL when its parent dies, PR_SET_PDEATHSIG). So
``make test`` sees whatever load the machine has and ``make test-stress`` a loaded one: a timing
test must pass in both regimes.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys
import time

HOGS = 2
DEFAULT_ARGS = ["-q", "-m", "timing and not slow", "tests"]
PR_SET_PDEATHSIG = 1


def _busy(parent: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's finally and SIGTERM handler still stop it
    if os.getppid() != parent:  # the parent died before the prctl took effect
        return
    while True:
        pass


def _stop(sig, frame) -> None:
    raise SystemExit(128 + sig)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _stop)
    context = multiprocessing.get_context("fork")
    hogs = [context.Process(target=_busy, args=(os.getpid(),), daemon=True) for _ in range(HOGS)]
    started = time.monotonic()
    try:
        for hog in hogs:
            hog.start()
        print(f"stress: {HOGS} busy-loop processes ({', '.join(str(h.pid) for h in hogs)}) beside pytest", flush=True)
        return subprocess.call([sys.executable, "-m", "pytest", *(argv or DEFAULT_ARGS)])
    finally:
        for hog in hogs:
            if hog.pid is not None:
                hog.kill()
                hog.join()
        print(f"stress: hogs stopped after {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
