"""A run its user stopped reads `stopped`, whatever its ranks managed to send on the way out.

Killing `rankscope demo` at the wrong moment left its run `running` for ever (issue 48): SIGTERM
about 15 s after start (2 ranks, a loaded host) stored rank 0's Hello and RunEnd and nothing of rank
1, which never said Hello; at another moment both ranks said Hello and rank 0, blocked in a gloo
collective until rank 1 exited, ran out of the stop's grace before its RunEnd. Here the ranks are
their wire messages at a real collector, in both shapes at once (world of 3: rank 0 ended itself,
rank 1 said Hello and was killed, rank 2 never said Hello), and the stop is the demo's guard
(`python -m collector.tools.supervise --guard`, what stops everything once the demo is killed)
with its real collector, training and parent processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc

from collector.data import catalog
from collector.testing.fake_runs.envelopes import envelope, hello
from collector.testing.streams import RawStream
from collector.tools import supervise
from collector.tools.launch import CollectorProcess
from proto import pb

RUN = "demo-20261128-000000-abcdef"


def _stored(data_dir) -> tuple[list, list]:
    con = catalog.connect(data_dir)
    try:
        runs = con.execute("SELECT run_id, status, n_ranks FROM runs").fetchall()
        ends = con.execute("SELECT rank, status, ended_by FROM rank_ends ORDER BY rank").fetchall()
    finally:
        con.close()
    return runs, ends


def _ranks_as_a_stop_left_them(collector: CollectorProcess) -> None:
    now = time.time_ns()
    with grpc.insecure_channel(collector.address) as channel:
        rank0 = RawStream(channel)  # stopped cleanly: its Hello and its RunEnd
        end = pb.RunEnd(run_id=RUN, rank=0, status="stopped", ended_at_ns=now)
        rank0.send(hello("r0", 1, RUN, 0, 3, started_at_ns=now), envelope("r0", 2, end=end))
        rank1 = RawStream(channel)  # its Hello, then SIGKILL: its stream just goes
        rank1.send(hello("r1", 1, RUN, 1, 3, started_at_ns=now))
        assert rank0.wait_acked({1, 2}) and rank1.wait_acked({1})
        rank0.finish()
        rank1.cancel()


def test_the_guard_ends_a_killed_demos_run_stopped_for_the_ranks_that_could_not(tmp_path):
    data = tmp_path / "data"
    spool = tmp_path / "spool"
    spool.mkdir()
    since = time.time()
    collector = CollectorProcess(data)
    training = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    parent = None
    try:
        _ranks_as_a_stop_left_them(collector)
        assert _stored(data) == ([(RUN, "running", 2)], [(0, "stopped", "rank")])
        # the demo: it starts the guard, watching it, the training and the collector, and is killed
        guard_argv = [sys.executable, "-m", "collector.tools.supervise", "--guard"]
        watched = [str(training.pid), str(collector.proc.pid), collector.address, str(spool), str(data), repr(since)]
        parent = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import os, subprocess, sys, time; "
                f"subprocess.Popen({guard_argv!r} + [str(os.getpid())] + {watched!r}); time.sleep(120)",
            ]
        )
        time.sleep(1.0)  # the guard is up, watching its parent
        os.killpg(training.pid, signal.SIGKILL)  # the ranks gone (torchrun's death signal, in the demo)
        training.wait()
        parent.kill()
        parent.wait()
        assert collector.proc.wait(timeout=60) == 0, collector.stderr()  # the guard stopped it
    finally:
        for proc in (training, parent, collector.proc):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    runs, ends = _stored(data)
    assert runs == [(RUN, "stopped", 2)], f"a run its user stopped must read 'stopped': {runs}, ends {ends}"
    # the rank's own end, and the two the guard recorded for the ranks that could not send theirs
    assert ends == [(0, "stopped", "rank"), (1, "stopped", "supervisor"), (2, "stopped", "supervisor")]


def test_only_runs_still_running_since_the_stopped_training_started_are_ended_each_once(tmp_path):
    """A run none of whose ranks ended (both killed in a collective) is ended whole; an older run is
    not the stopped training's; a second call finds nothing left to end."""
    data = tmp_path / "data"
    other = "demo-20261128-000001-abcdef"
    with CollectorProcess(data) as collector:
        _ranks_as_a_stop_left_them(collector)
        with grpc.insecure_channel(collector.address) as channel:
            killed = RawStream(channel)
            killed.send(hello("o0", 1, other, 0, 2, started_at_ns=time.time_ns()))
            assert killed.wait_acked({1})
            killed.cancel()
        assert supervise.end_unended_runs(str(data), collector.address, time.time() + 60) == []  # older runs
        ended = supervise.end_unended_runs(str(data), collector.address, time.time() - 60)
        assert ended == [(RUN, 1), (RUN, 2), (other, 0), (other, 1)]
        assert supervise.end_unended_runs(str(data), collector.address, time.time() - 60) == []
    con = catalog.connect(data)
    try:
        runs = con.execute("SELECT run_id, status, n_ranks FROM runs ORDER BY run_id").fetchall()
    finally:
        con.close()
    assert runs == [(RUN, "stopped", 2), (other, "stopped", 1)]
