"""SIGKILL the collector mid-stream (and mid-compaction), restart it, resend what
was not acked: every record is stored exactly once."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import grpc
import pytest

from collector.data import catalog
from collector.testing.fake_runs import comm_envelope, hello
from collector.testing.streams import RawStream
from collector.tools.launch import CollectorProcess, collector_command

# A collector committing and compacting often, so kills land inside both.
FAST = ("--flush-interval", "0.02", "--compaction-interval", "0.05", "--compaction-min-files", "3")

RANKS, ENVELOPES, ROWS = 4, 60, 200


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
        collector = CollectorProcess(data, *FAST)
        try:
            send_until_killed(collector.port, acked, kill_after)
        finally:
            collector.kill()
        killed_with_unacked += sum(len(a) < ENVELOPES + 1 for a in acked)

    collector = CollectorProcess(data, *FAST)
    partition = data / "parquet" / "comm" / "run=crashy"
    try:
        send_until_killed(collector.port, acked, None)
        deadline = time.monotonic() + 60
        while not list(partition.glob("cmp-*.parquet")) and time.monotonic() < deadline:
            time.sleep(0.05)  # the compactor runs at low priority: give it a moment
    finally:
        assert collector.stop() == 0

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
    assert len(os.listdir(data / "ledger")) <= 4  # one checkpoint, one log, the manifest, the lock


def test_collect_prints_its_address_and_commits_everything_on_sigterm(tmp_path):
    data = tmp_path / "data"
    collector = CollectorProcess(data)
    channel = grpc.insecure_channel(collector.address)
    s = RawStream(channel)
    s.send(*(comm_envelope("c", seq, "r", 0, seq * 100, 100) for seq in range(1, 6)))
    assert s.wait_acked(range(1, 6))
    assert collector.stop() == 0
    assert "Traceback" not in collector.stderr()
    channel.close()
    assert catalog.connect(data).execute("SELECT count(*) FROM comm").fetchone() == (500,)

    # the data dir is free again, and a busy one is refused with a message, not a traceback
    with CollectorProcess(data):
        second = subprocess.run(collector_command(str(data), port=0), capture_output=True, text=True, timeout=60)
    assert second.returncode == 1
    assert "in use by another collector" in second.stderr and "Traceback" not in second.stderr
    # settings out of range are refused by name (exit code 2), before the data dir is touched
    for option, value, message in (
        ("--flush-interval", "9", r"store\.flush_interval: must be <= 5 \(got 9\.0\)"),
        ("--compaction-min-files", "1", r"compaction\.min_files: must be >= 2 \(got 1\)"),
    ):
        with pytest.raises(RuntimeError, match=r"exit 2\)[\s\S]*" + message):
            CollectorProcess(data, option, value)
