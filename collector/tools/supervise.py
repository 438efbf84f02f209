"""Children that cannot outlive whoever started them, and ranks that end "stopped" when told to stop.

Three pieces, used by ``rankscope demo`` (collector/tools/demo.py):

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
* ``python -m collector.tools.supervise --guard ...`` (``guard``): a small process that does the
  demo's clean stop for it when the demo is killed: training first, while the collector still takes
  the ranks' last records and RunEnd ("stopped"), then the collector, then the spool dir.
* ``end_unended_runs``: the last word of a stop, the demo's or its guard's. A rank asked to stop does
  not always get its RunEnd to the collector: blocked in a collective whose peer stopped first it
  runs no signal handler until that collective fails, and the stop's grace may be spent by then
  (SIGKILL); starved of CPU (nice 10 on a busy host) it may not get through its close; stopped while
  the ranks start, one may never have said Hello. Its run then read ``running`` for ever. Once the
  training is gone, whoever stopped it sends the collector a RunEnd ``stopped`` for each rank of the
  runs it served that has none stored, so a run its user stopped reads ``stopped`` whatever the timing.
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
    _quiet_output()
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _quiet_output() -> None:
    """From a stop on, the rank's output goes nowhere: whoever read it (the demo) may be gone, and a
    write into its closed pipe would fail the rank on its way out, before its RunEnd is sent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
    except OSError:
        pass


class _OutputWhileItIsRead:
    """A rank's stdout/stderr that survives its reader: once a write fails (the demo that read the
    pipe was killed), the rank's output goes to /dev/null and training, and its RunEnd, go on."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            _quiet_output()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            _quiet_output()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def run_module(module: str, argv: list[str]) -> None:
    parent = os.getppid()
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a closed reader is a failed write, never a death
    sys.stdout, sys.stderr = _OutputWhileItIsRead(sys.stdout), _OutputWhileItIsRead(sys.stderr)
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


GUARD_TRAINING_S = 45.0  # how long the guard waits for the training to stop after its death signal
GUARD_COLLECTOR_S = 60.0  # and for the collector to commit and exit after its SIGTERM


def deliver_spooled(spool_dir: str, endpoint: str) -> None:
    """Send what the ranks spooled and never got acked (they stopped under load before the collector
    answered) to the collector while it still runs, so the run is whole and the spool dir empties."""
    from pathlib import Path

    from collector.rank.resend import resend_spooled

    if os.path.isdir(spool_dir) and os.listdir(spool_dir):
        resend_spooled(Path(spool_dir), endpoint, timeout_s=30.0)


def end_unended_runs(data_dir: str, endpoint: str, since_s: float, timeout_s: float = 30.0) -> list[tuple[str, int]]:
    """A stop by its user, once the training is gone and what its ranks spooled is delivered: every
    run in ``data_dir`` that started at or after ``since_s`` (unix seconds; the runs of the stopped
    training, served by a collector of its own) and reads ``running`` gets, for each rank of its world
    size with no RunEnd stored, a RunEnd ``stopped`` sent on the rank's behalf to the collector at
    ``endpoint`` (one stream each, under a client id of this process's), acked when durable (module
    docstring: why a rank may not have sent its own). A run that failed keeps its status. Returns the
    (run_id, rank) ends acked; never raises (the stop goes on: the run then reads ``running``)."""
    try:
        missing = _unended_ranks(data_dir, since_s)
        return _send_ends(endpoint, missing, timeout_s) if missing else []
    except Exception as exc:  # the rest of the stop (the collector, the spool dir) must still happen
        _say(f"rankscope: could not end the stopped run(s) in {data_dir}: {exc!r}")
        return []


def _say(line: str) -> None:
    """A line on stderr, if anyone still reads it (the guard's is the killed demo's)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _unended_ranks(data_dir: str, since_s: float) -> list[tuple[str, int]]:
    from collector.data import catalog

    con = catalog.connect(data_dir)
    try:
        rows = con.execute(
            "SELECT r.run_id, r.world_size, coalesce(list(e.rank) FILTER (WHERE e.rank IS NOT NULL), []) "
            "FROM runs r LEFT JOIN rank_ends e USING (run_id) "
            "WHERE r.status = 'running' AND epoch(r.started_at::TIMESTAMPTZ) >= ? "
            "GROUP BY r.run_id, r.world_size ORDER BY r.run_id",
            [since_s],
        ).fetchall()
    finally:
        con.close()
    return [(run_id, rank) for run_id, world, ended in rows for rank in range(world) if rank not in set(ended)]


def _send_ends(endpoint: str, missing: list[tuple[str, int]], timeout_s: float) -> list[tuple[str, int]]:
    import socket
    import time

    import grpc

    from collector.data import security
    from proto import SCHEMA_VERSION, pb, pb_grpc

    ended = []
    client = f"{socket.gethostname()}.{os.getpid()}.{time.time_ns()}.stop".replace("-", "_")
    with security.open_channel(endpoint) as channel:
        stub = pb_grpc.CollectorStub(channel)
        for i, (run_id, rank) in enumerate(missing):  # one stream and client each: one rank of one run
            end = pb.RunEnd(
                run_id=run_id, rank=rank, status="stopped", ended_at_ns=time.time_ns(), ended_by="supervisor"
            )
            env = pb.Envelope(schema_version=SCHEMA_VERSION, client_id=f"{client}{i}", seq=1, end=end)
            call = stub.Stream(iter([env]), timeout=timeout_s)
            try:
                if any(1 in ack.seqs for ack in call):
                    ended.append((run_id, rank))
            except grpc.RpcError as exc:
                _say(f"rankscope: RunEnd of {run_id} rank {rank} not stored: {exc.details()}")
            finally:
                call.cancel()
    return ended


def guard(
    parent: int,
    train_pgid: int,
    collector_pid: int,
    endpoint: str,
    spool_dir: str,
    data_dir: str | None = None,
    since_s: float | None = None,
) -> None:
    """``python -m collector.tools.supervise --guard ...``: what the demo does on its way out, done
    for it when it is killed (SIGKILL runs no handler): once ``parent`` is gone, wait for the training
    (torchrun stops its ranks on its own death signal; SIGKILL after GUARD_TRAINING_S), deliver what
    they spooled, end the runs of ``data_dir`` started since ``since_s`` that the ranks left
    unended (``end_unended_runs``), stop the collector (SIGTERM: it commits), remove the spool dir
    if empty. The demo's own clean stop ends the guard first (SIGTERM). Ctrl-C and a closed
    terminal are the demo's to handle: the guard ignores them."""
    import shutil
    import time

    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    ranks: list[int] = []
    while os.getppid() == parent:
        if not ranks:  # torchrun starts its ranks in sessions of their own: know them before it goes
            ranks = children(train_pgid)
        time.sleep(0.5)
    ranks = ranks or children(train_pgid)
    stop_training(train_pgid, ranks, GUARD_TRAINING_S, signal_first=False)
    deliver_spooled(spool_dir, endpoint)
    if data_dir is not None and since_s is not None:
        end_unended_runs(data_dir, endpoint, since_s)
    _quietly(lambda: os.kill(collector_pid, signal.SIGTERM))
    _wait_gone(lambda: _alive_or_raise(collector_pid), GUARD_COLLECTOR_S)
    if os.path.isdir(spool_dir) and not os.listdir(spool_dir):
        shutil.rmtree(spool_dir, ignore_errors=True)


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (torchrun's ranks), from /proc."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def stop_training(torchrun_pid: int, ranks: list[int], timeout_s: float, *, signal_first: bool = True) -> None:
    """Stop torchrun (its own process group) and wait for it and its ranks, which torchrun starts in
    sessions of their own, so that their RunEnd reaches the collector before anyone stops it: SIGINT
    to torchrun's group (unless ``signal_first`` is False: its death signal did that), up to
    ``timeout_s`` for all of them, then SIGKILL to what is left."""
    if signal_first:
        _quietly(lambda: os.killpg(torchrun_pid, signal.SIGINT))
    everyone = [torchrun_pid, *ranks]
    if not _wait_gone(lambda: _any_alive(everyone), timeout_s):
        _quietly(lambda: os.killpg(torchrun_pid, signal.SIGKILL))
        for pid in ranks:
            _quietly(lambda pid=pid: os.kill(pid, signal.SIGKILL))


def _any_alive(pids: list[int]) -> None:
    """Raises ProcessLookupError once none of ``pids`` is alive (a zombie counts as gone)."""
    for pid in pids:
        try:
            _alive_or_raise(pid)
            return
        except (ProcessLookupError, FileNotFoundError):
            continue
    raise ProcessLookupError(pids)


def _alive_or_raise(pid: int) -> None:
    with open(f"/proc/{pid}/stat") as f:  # FileNotFoundError once it is gone
        if f.read().rsplit(")", 1)[1].split()[0] == "Z":
            raise ProcessLookupError(pid)


def _wait_gone(probe, timeout_s: float) -> bool:
    """Poll ``probe`` (raises once what it looks at is gone) up to ``timeout_s``; True if gone."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            probe()
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            return True
        time.sleep(0.5)
    return False


def _quietly(action) -> None:
    try:
        action()
    except (ProcessLookupError, PermissionError):
        pass


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "--guard":
        parent, train_pgid, collector_pid, endpoint, spool_dir = sys.argv[2:7]
        data_dir, since_s = (sys.argv[7], float(sys.argv[8])) if len(sys.argv) >= 9 else (None, None)
        guard(int(parent), int(train_pgid), int(collector_pid), endpoint, spool_dir, data_dir, since_s)
        return
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m collector.tools.supervise MODULE [ARGS...]")
    run_module(sys.argv[1], sys.argv[2:])


if __name__ == "__main__":
    main()
