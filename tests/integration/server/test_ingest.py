"""The collector over a real gRPC channel: exact counts, dedupe, ack-after-durable.

Split by tier: the pure-function tests are in tests/unit/server/test_ingest.py."""

from __future__ import annotations

import contextlib
import threading

import pyarrow.parquet as pq
import pytest

from collector.data import catalog
from collector.server.compaction import CompactionConfig
from collector.server.store import StoreConfig
from collector.testing.collectors import live_collector, stored_rows
from collector.testing.fake_runs import comm_envelope, hello, run_end
from collector.testing.streams import RawStream
from proto import pb, pb_grpc


@pytest.fixture
def collector(tmp_path):
    """start(data_dir=tmp_path / "data", **live_collector options) -> (channel, state); all stopped at the end."""
    with contextlib.ExitStack() as running:

        def start(data_dir=tmp_path / "data", **kw):
            live = running.enter_context(live_collector(data_dir, grace_s=0, **kw))
            return live.channel(), live.state

        yield start


def test_concurrent_streams_store_every_record_exactly_once(collector, tmp_path):
    channel, _state = collector()
    ranks, batches, rows = 6, 12, 250
    streams = []
    for rank in range(ranks):
        s = RawStream(channel)
        cid = f"client-{rank}"
        s.send(hello(cid, 1, "job", rank, ranks))
        s.send(*(comm_envelope(cid, 2 + b, "job", rank, b * rows, rows) for b in range(batches)))
        s.send(run_end(cid, 2 + batches, "job", rank))
        streams.append(s)
    for s in streams:
        s.finish()
        assert s.error is None
        assert s.acked == set(range(1, batches + 3))

    con = catalog.connect(tmp_path / "data")
    total, distinct = con.execute("SELECT count(*), count(DISTINCT (rank, seq)) FROM comm").fetchone()
    assert total == distinct == ranks * batches * rows
    assert con.execute("SELECT count(*) FROM comm WHERE run_id <> 'job' OR bytes <> 1024").fetchone() == (0,)
    run = con.execute("SELECT name, world_size, status, n_ranks FROM runs").fetchall()
    assert run == [("job", ranks, "finished", ranks)]
    health = pb_grpc.CollectorStub(channel).Health(pb.HealthRequest())
    assert health.records_durable == ranks * batches * rows
    assert health.schema_version == 1 and health.batches_rejected == 0


def test_resent_envelopes_are_acked_without_being_written_again(collector, tmp_path):
    channel, _ = collector()
    first = RawStream(channel)
    envelopes = [comm_envelope("c", seq, "r", 0, seq * 100, 100) for seq in range(1, 6)]
    first.send(*envelopes)
    assert first.wait_acked(range(1, 6))
    # The same envelopes again, on the same stream and on a second one (a reconnect).
    first.send(*envelopes[:3])
    second = RawStream(channel)
    second.send(*envelopes, comm_envelope("c", 6, "r", 0, 600, 100))
    second.finish()
    first.finish()
    assert second.acked == set(range(1, 7)) and first.acked == set(range(1, 6))
    assert stored_rows(tmp_path / "data") == 600


def test_the_same_envelope_racing_on_two_streams_is_written_once(collector, tmp_path):
    channel, _ = collector(store_config=StoreConfig(flush_interval=0.5))
    a, b = RawStream(channel), RawStream(channel)
    envelopes = [comm_envelope("c", seq, "r", 0, seq * 10, 10) for seq in range(1, 41)]
    a.send(*envelopes)
    b.send(*reversed(envelopes))  # still buffered when b's copies arrive
    a.finish()
    b.finish()
    assert a.acked == b.acked == set(range(1, 41))
    assert stored_rows(tmp_path / "data") == 400


def test_acks_arrive_only_after_the_rows_are_in_committed_segments(collector, tmp_path):
    data = tmp_path / "data"
    seen_at_ack: list[tuple[int, int]] = []

    def on_ack(seqs):  # runs on receipt, before the test thread can look
        seen_at_ack.append((max(seqs), stored_rows(data)))

    channel, _ = collector()
    s = RawStream(channel, on_ack=on_ack)
    for seq in range(1, 9):
        s.send(comm_envelope("c", seq, "r", 0, seq * 50, 50))
        assert s.wait_acked([seq])
    s.finish()
    assert seen_at_ack
    for acked_upto, rows_on_disk in seen_at_ack:
        assert rows_on_disk >= acked_upto * 50


def test_dedupe_survives_a_clean_restart(collector, tmp_path):
    data = tmp_path / "data"
    channel, state = collector(data_dir=data)
    s = RawStream(channel)
    s.send(*(comm_envelope("c", seq, "r", 0, seq * 10, 10) for seq in range(1, 11)))
    s.finish()
    state.store.close()  # release the data dir as a stopped collector would

    channel2, _ = collector(data_dir=data)
    again = RawStream(channel2)
    again.send(*(comm_envelope("c", seq, "r", 0, seq * 10, 10) for seq in range(1, 13)))
    again.finish()
    assert again.acked == set(range(1, 13))
    assert stored_rows(data) == 120


def test_first_hello_of_a_run_wins_and_status_follows_run_ends(collector, tmp_path):
    channel, _ = collector()
    streams = [RawStream(channel) for _ in range(3)]
    for rank, s in enumerate(streams):
        s.send(hello(f"c{rank}", 1, "r", rank, 3, run_name=f"name-{rank}", source="hook"))
        assert s.wait_acked([1])
    con = lambda: catalog.connect(tmp_path / "data")
    assert con().execute("SELECT name, status, n_ranks, ended_at FROM runs").fetchall() == [
        ("name-0", "running", 3, None)
    ]
    streams[0].send(run_end("c0", 2, "r", 0))
    streams[1].send(run_end("c1", 2, "r", 1))
    for s in streams[:2]:
        assert s.wait_acked([2])
    assert con().execute("SELECT status FROM runs").fetchall() == [("running",)]
    streams[2].send(run_end("c2", 2, "r", 2, status="failed"))
    assert streams[2].wait_acked([2])
    assert con().execute("SELECT status, ended_at IS NOT NULL FROM runs").fetchall() == [("failed", True)]
    ranks = con().execute("SELECT rank, status FROM ranks ORDER BY rank").fetchall()
    assert ranks == [(0, "finished"), (1, "finished"), (2, "failed")]
    for s in streams:
        s.finish()


def test_streams_can_start_without_hello(collector, tmp_path):
    # A client resending from its spool after a reconnect starts with table batches.
    channel, _ = collector()
    s = RawStream(channel)
    s.send(comm_envelope("spooled", 7, "r", 1, 0, 30))
    s.finish()
    assert s.acked == {7} and s.error is None
    assert stored_rows(tmp_path / "data") == 30


def test_compaction_merges_segments_without_losing_or_duplicating_rows(collector, tmp_path):
    data = tmp_path / "data"
    channel, state = collector(data_dir=data)
    s = RawStream(channel)
    for seq in range(1, 21):  # one commit per envelope -> 20 small segments
        s.send(comm_envelope("c", seq, "r", 0, seq * 100, 100))
        assert s.wait_acked([seq])
    partition = data / "parquet" / "comm" / "run=r"
    assert len(list(partition.glob("*.parquet"))) == 20

    counts: list[int] = []
    errors: list[Exception] = []
    stop = threading.Event()

    def read_while_compacting():
        while not stop.is_set():
            try:
                counts.append(catalog.run_readonly_query(data, "SELECT count(*) AS n FROM comm")["n"][0].as_py())
            except Exception as exc:
                errors.append(exc)

    reader = threading.Thread(target=read_while_compacting)
    reader.start()
    state.compactor.config = CompactionConfig(interval=3600, min_files=4, target_bytes=1 << 30)
    merges = state.compactor.run_once()
    stop.set()
    reader.join()
    s.finish()

    files = list(partition.glob("*.parquet"))
    # two partitions merged: comm and the collector's deliveries rows of the same envelopes
    assert merges == 2 and len(files) == 1 and files[0].name.startswith("cmp-")
    assert pq.ParquetFile(files[0]).metadata.num_rows == 2000
    assert not list(partition.glob(".*"))  # no temporary left behind
    # A reader sees the 20 segments or the merged one: never a row missing or twice (ledger manifest).
    assert not errors
    assert counts and set(counts) == {2000}
    con = catalog.connect(data)
    assert con.execute("SELECT count(*), count(DISTINCT seq) FROM comm").fetchone() == (2000, 2000)


def test_back_pressure_holds_streams_without_losing_anything(collector, tmp_path):
    # Buffers far smaller than what is in flight: submit blocks until commits free room.
    tiny = StoreConfig(flush_interval=0.05, flush_bytes=64 << 10, max_buffered_bytes=256 << 10)
    channel, _ = collector(store_config=tiny)
    streams = [RawStream(channel) for _ in range(4)]
    for rank, s in enumerate(streams):
        s.send(*(comm_envelope(f"c{rank}", seq, "r", rank, seq * 2000, 2000) for seq in range(1, 16)))
    for s in streams:
        s.finish()
        assert s.error is None and s.acked == set(range(1, 16))
    assert stored_rows(tmp_path / "data") == 4 * 15 * 2000
