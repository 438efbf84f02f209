"""Children that cannot outlive whoever started them, and ranks that end "stopped" when told to stop.

Two pieces, used by ``rankscope demo`` (collector/tools/demo.py):

* ``die_with_parent(sig)``: Linux's ``PR_SET_PDEATHSIG``. Called in a child (a ``preexec_fn``), it
  asks the kernel to send ``sig`` to the child when the thread that started it exits: the demo
  killed with SIGKILL, or its terminal gone, still stops its collector, dashboard and torchrun.
  A no-op where prctl is not there.
* ``python -m collector.tools.supervise MODULE [ARGS...]``: runs MODULE as ``python -m MODULE``
  would (torchrun starts each rank so), after
  - ``die_with_parent(SIGTERM)``: the rank stops when torchrun goes, however torchrun went
    (before, a demo whose parent vanished left 4 ranks training, spooling into /tmp, for minutes);
  - SIGINT, SIGTERM and SIGHUP noted as a stop asked by the user (collector.rank.session
    ``note_stopped``: the run ends ``stopped``, not ``failed``), then raised as KeyboardInterrupt, so
    the training unwinds, its telemetry flushes at exit, and no rank prints a traceback for it;
  - a ``ConfigError`` (a bad value, a world size the config's layout cannot take) said in one line
    naming the key, exit 2; the traceback only with ``RANKSCOPE_DEBUG=1``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import runpy
import signal
import sys

from collector.data.config import ConfigError

PR_SET_PDEATHSIG = 1
USER_ERROR_EXIT = 2  # a config error: one line naming the key, no traceback
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits; True where it took."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stop_asked(signum, _frame) -> None:
    from collector.rank import session

    session.note_stopped()
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run_module(module: str, argv: list[str]) -> None:
    parent = os.getppid()
    die_with_parent(signal.SIGTERM)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop_asked)
    if os.getppid() != parent:  # the parent went before the death signal was armed
        _stop_asked(signal.SIGTERM, None)
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except ConfigError as exc:  # a bad config value, a world size its layout cannot take: the user's to fix
        if os.environ.get("RANKSCOPE_DEBUG") == "1":
            raise
        # every rank says it (the first to fail has torchrun stop the others): the demo shows it once
        print(f"error: {exc} (RANKSCOPE_DEBUG=1 shows the traceback)", file=sys.stderr, flush=True)
        sys.exit(USER_ERROR_EXIT)
    except KeyboardInterrupt:
        # asked to stop: a quiet end with the shell's code for it; the session's atexit hook
        # flushes the telemetry and sends RunEnd("stopped")
        from collector.rank import session

        session.note_stopped()
        sys.exit(128 + signal.SIGINT)


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m collector.tools.supervise MODULE [ARGS...]")
    run_module(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    main()
