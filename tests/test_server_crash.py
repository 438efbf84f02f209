"""SIGKILL the collector mid-stream (and mid-compaction), restart it, resend what
was not acked: every record is stored exactly once."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import grpc

from _server_util import RawStream, comm_envelope, hello
from collector import catalog

# A collector committing and compacting often, so kills land inside both.
COLLECTOR = """
import signal, sys, threading
from collector.compaction import CompactionConfig
from collector.server import create_server
from collector.store import StoreConfig
server, port, state = create_server("127.0.0.1:0", sys.argv[1],
                                    store_config=StoreConfig(flush_interval=0.02),
                                    compaction_config=CompactionConfig(interval=0.05, min_files=3))
server.start()
print(f"listening {port}", flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
server.stop(2).wait()
state.close()
"""

RANKS, ENVELOPES, ROWS = 4, 60, 200


def start_collector(data_dir) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", COLLECTOR, str(data_dir)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.match(r"listening (\d+)", line)
    assert match, f"collector did not start: {line!r}"
    return proc, int(match.group(1))


def envelope(rank: int, seq: int):
    cid = f"rank-{rank}"
    if seq == 1:
        return hello(cid, 1, "crashy", rank, RANKS)
    return comm_envelope(cid, seq, "crashy", rank, (seq - 2) * ROWS, ROWS)


def send_until_killed(port: int, acked: list[set[int]], kill_after: float | None) -> None:
    """Each rank streams every seq it has no ack for (a paced resend from the top)."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    streams = []
    for rank in range(RANKS):
        s = RawStream(channel)
        streams.append(s)

        def pump(rank=rank, s=s):
            for seq in range(1, ENVELOPES + 2):
                if s.done.is_set():
                    return
                if seq not in acked[rank]:
                    s.send(envelope(rank, seq))
                    time.sleep(0.004)
            if kill_after is None:
                s.close()
        threading.Thread(target=pump, daemon=True).start()
    if kill_after is not None:
        # Kill at the first ack (or after kill_after at the latest): the sends are paced over
        # ~0.25 s, so the kill lands with data in flight however fast or loaded the machine is.
        deadline = time.monotonic() + kill_after
        while time.monotonic() < deadline and not any(len(s.acked) > len(acked[r]) for r, s in enumerate(streams)):
            time.sleep(0.002)
    else:
        for s in streams:
            assert s.done.wait(90)
            assert s.error is None, s.error
    for rank, s in enumerate(streams):
        acked[rank] |= s.acked
    channel.close()


def test_sigkill_mid_stream_then_resend_stores_every_record_exactly_once(tmp_path):
    data = tmp_path / "data"
    acked: list[set[int]] = [set() for _ in range(RANKS)]
    killed_with_unacked = 0
    for kill_after in (0.35, 0.25, 0.4):
        proc, port = start_collector(data)
        try:
            send_until_killed(port, acked, kill_after)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        killed_with_unacked += sum(len(a) < ENVELOPES + 1 for a in acked)

    proc, port = start_collector(data)
    partition = data / "parquet" / "comm" / "run=crashy"
    try:
        send_until_killed(port, acked, None)
        deadline = time.monotonic() + 60
        while not list(partition.glob("cmp-*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.05)  # the compactor runs at low priority: give it a moment
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0

    assert killed_with_unacked > 0, "the kills all came after everything was acked"
    assert all(a == set(range(1, ENVELOPES + 2)) for a in acked)
    con = catalog.connect(data)
    total, distinct = con.execute("SELECT count(*), count(DISTINCT (rank, seq)) FROM comm").fetchone()
    assert total == distinct == RANKS * ENVELOPES * ROWS
    assert con.execute("SELECT count(*) FROM ranks").fetchone() == (RANKS,)
    assert con.execute("SELECT count(*) FROM _runs_raw").fetchone() == (1,)
    assert list(partition.glob("cmp-*.parquet")), "no compaction ran"
    leftovers = [p for p in (data / "parquet").rglob(".*") if not p.name.startswith(".schema")]
    assert leftovers == []
    assert len(os.listdir(data / "ledger")) <= 3  # one checkpoint, one log, the lock


SERVE = "import sys; from collector.server import serve; sys.exit(serve(sys.argv[1], port=0))"


def test_serve_prints_its_address_and_commits_everything_on_sigterm(tmp_path):
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(data)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
    assert match, line
    channel = grpc.insecure_channel(f"127.0.0.1:{match.group(1)}")
    s = RawStream(channel)
    s.send(*(comm_envelope("c", seq, "r", 0, seq * 100, 100) for seq in range(1, 6)))
    assert s.wait_acked(range(1, 6))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert "Traceback" not in proc.stderr.read()
    channel.close()
    assert catalog.connect(data).execute("SELECT count(*) FROM comm").fetchone() == (500,)

    # the data dir is free again, and a busy one is refused with a message, not a traceback
    first = subprocess.Popen([sys.executable, "-c", SERVE, str(data)], stdout=subprocess.PIPE, text=True)
    assert "listening" in first.stdout.readline()
    second = subprocess.run([sys.executable, "-c", SERVE, str(data)], capture_output=True, text=True, timeout=60)
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0
    assert second.returncode == 1
    assert "in use by another collector" in second.stderr and "Traceback" not in second.stderr
