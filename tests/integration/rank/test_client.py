"""The rank-side client against a real gRPC server on a real port: acks,
reconnect with the same seqs, spooling while nothing listens, rejected batches,
tokens, the memory bound. The server is tests/integration/rank/_rank_util.RecordingCollector.

Split by tier: the pure-function tests are in tests/unit/rank/test_client.py."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path

from collector.data import codec
from collector.rank import spool
from collector.rank.client import Client, ClientConfig
from collector.rank.records import RecordBuffer
from collector.testing.ports import free_port
from proto import pb
from tests.integration.rank._rank_util import serve

FAST = dict(flush_interval_s=0.05, spool_after_s=0.2, backoff_initial_s=0.05, backoff_max_s=0.2, close_timeout_s=5.0)


def make_client(
    endpoint: str, spool_dir: Path, token: str | None = None, max_rows: int = 100_000, batch_rows: int = 8192
):
    buf = RecordBuffer(max_rows=max_rows)
    cfg = ClientConfig(endpoint=endpoint, token=token, spool_dir=spool_dir, batch_rows=batch_rows, **FAST)
    client = Client(cfg, "testhost.1.abcd", buf)
    client.start(pb.Hello(run_id="r-1", run_name="r", rank=3, world_size=4))
    return client, buf


def add_timers(buf: RecordBuffer, start: int, n: int) -> None:
    for i in range(start, start + n):
        buf.add_row("timers", {"name": "fwd", "start_ns": i, "dur_ns": 10 * i}, step=i)


def end(client):
    return client.close(pb.RunEnd(run_id="r-1", rank=3, status="finished"))


def test_rows_arrive_acked_and_in_order(tmp_path):
    server, port, col = serve()
    try:
        client, buf = make_client(f"127.0.0.1:{port}", tmp_path)
        add_timers(buf, 0, 500)
        assert col.wait_for(lambda: col.rows("timers") is not None and col.rows("timers").num_rows == 500)
        add_timers(buf, 500, 500)
        assert end(client)
        rows = col.rows("timers").to_pydict()
        assert rows["start_ns"] == list(range(1000))
        assert rows["dur_ns"] == [10 * i for i in range(1000)]
        assert set(rows["rank"]) == {3} and set(rows["run_id"]) == {"r-1"}
        kinds = [e.WhichOneof("body") for e in col.envelopes()]
        assert kinds[0] == "hello" and kinds[-1] == "end"
        assert [e.seq for e in col.envelopes()] == list(range(1, len(kinds) + 1))
        assert col.envelopes("end")[0].end.dropped_records == 0
        assert client.pending == 0 and not list(tmp_path.iterdir())
    finally:
        server.stop(0)


def test_batches_are_split_at_batch_rows(tmp_path):
    server, port, col = serve()
    try:
        client, buf = make_client(f"127.0.0.1:{port}", tmp_path, batch_rows=100)
        add_timers(buf, 0, 250)
        assert end(client)
        sizes = [e.table.rows for e in col.envelopes("table")]
        assert max(sizes) <= 100 and sum(sizes) == 250
    finally:
        server.stop(0)


def test_stream_drop_resends_same_seqs_without_loss(tmp_path):
    server, port, col = serve()
    col.drop_after = 3  # abort the first stream at its 3rd envelope, un-acked
    try:
        client, buf = make_client(f"127.0.0.1:{port}", tmp_path, batch_rows=50)
        add_timers(buf, 0, 400)
        assert end(client)
        assert col.streams >= 2
        seqs = [e.seq for e in col.received]
        resent = {s for s in seqs if seqs.count(s) > 1}
        assert resent, "the envelope lost with the first stream was sent again"
        assert {e.client_id for e in col.received} == {"testhost.1.abcd"}
        assert sorted(col.rows("timers").to_pydict()["start_ns"]) == list(range(400))
    finally:
        server.stop(0)


def test_spools_while_nothing_listens_then_resends_and_deletes(tmp_path):
    port = free_port()
    client, buf = make_client(f"127.0.0.1:{port}", tmp_path)
    add_timers(buf, 0, 300)
    # nothing listens: after spool_after_s the envelopes land on disk
    deadline = time.monotonic() + 10
    while not spool.files(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    files = spool.files(tmp_path)
    assert files, "envelopes were spooled"
    spooled = [e for f in files for e in spool.read(f)]
    assert spooled[0].HasField("hello") and spooled[0].client_id == "testhost.1.abcd"
    server, port2, col = serve(port)
    try:
        assert port2 == port
        add_timers(buf, 300, 100)
        assert end(client)
        assert sorted(col.rows("timers").to_pydict()["start_ns"]) == list(range(400))
        assert not spool.files(tmp_path), "spool files are deleted once acked"
    finally:
        server.stop(0)


def test_garbage_endpoint_never_raises_and_keeps_everything_on_disk(tmp_path, caplog):
    client, buf = make_client("this is not an endpoint:::", tmp_path)
    add_timers(buf, 0, 200)
    client.cfg.close_timeout_s = 0.5
    assert end(client) is False
    envs = [e for f in spool.files(tmp_path) for e in spool.read(f)]
    kinds = [e.WhichOneof("body") for e in envs]
    assert kinds[0] == "hello" and kinds[-1] == "end"
    rows = sum(e.table.rows for e in envs if e.HasField("table"))
    assert rows == 200


def test_rejected_batch_is_dropped_counted_and_the_rest_delivered(tmp_path, caplog):
    server, port, col = serve()
    col.reject_tables = {"monitor"}
    try:
        client, buf = make_client(f"127.0.0.1:{port}", tmp_path)
        for i in range(7):
            buf.add_row("monitor", {"tag": "Train/loss", "value": 1.0 / (i + 1), "samples": i}, step=i)
        add_timers(buf, 0, 20)
        with caplog.at_level(logging.ERROR, logger="rankscope.client"):
            assert end(client)
        assert "rejected envelope" in caplog.text
        assert col.rows("monitor") is None
        assert col.rows("timers").num_rows == 20
        assert col.envelopes("end")[0].end.dropped_records == 7
    finally:
        server.stop(0)


def test_token_is_sent_as_bearer_and_a_wrong_one_spools(tmp_path, caplog):
    server, port, col = serve(token="s3cret")
    try:
        client, buf = make_client(f"127.0.0.1:{port}", tmp_path / "ok", token="s3cret")
        add_timers(buf, 0, 10)
        assert end(client)
        assert col.rows("timers").num_rows == 10
        bad, buf2 = make_client(f"127.0.0.1:{port}", tmp_path / "bad", token="wrong")
        add_timers(buf2, 0, 10)
        bad.cfg.close_timeout_s = 0.5
        with caplog.at_level(logging.ERROR, logger="rankscope.client"):
            assert end(bad) is False
        assert "UNAUTHENTICATED" in caplog.text
        assert spool.files(tmp_path / "bad")
    finally:
        server.stop(0)


def test_memory_bound_drops_and_reports(tmp_path):
    server, port, col = serve()
    try:
        buf = RecordBuffer(max_rows=50)
        add_timers(buf, 0, 80)  # before the client runs: the bound is hit
        assert buf.dropped == 30 and len(buf) == 50
        client = Client(ClientConfig(endpoint=f"127.0.0.1:{port}", spool_dir=tmp_path, **FAST), "c.1.x", buf)
        client.start(pb.Hello(run_id="r-1", run_name="r", rank=3, world_size=4))
        assert end(client)
        assert col.rows("timers").num_rows == 50
        assert col.envelopes("end")[0].end.dropped_records == 30
    finally:
        server.stop(0)


def test_rows_missing_a_column_get_nulls_not_made_up_values(tmp_path):
    server, port, col = serve()
    try:
        client, buf = make_client(f"127.0.0.1:{port}", tmp_path)
        buf.add_row("moe", {"layer": 0, "expert": 1, "tokens": 5}, step=1)
        buf.add_row("moe", {"layer": 0, "expert": 2, "tokens": 7, "capacity": 8}, step=1)
        buf.add_row("moe", {"layer": 0, "expert": 3, "tokens": "many"}, step=1)  # bad type: dropped alone
        assert end(client)
        rows = sorted(zip(*[col.rows("moe").to_pydict()[k] for k in ("expert", "capacity")]))
        assert rows == [(1, None), (2, 8)]
        assert col.envelopes("end")[0].end.dropped_records == 1
    finally:
        server.stop(0)


def test_orphaned_spool_of_a_dead_process_is_resent_to_its_collector_and_deleted(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = spool.local_host_id()
    orphan_id = f"{host}.{dead.pid}.dead"
    live_id = f"{host}.{os.getpid()}.live"  # a running writer's files are not touched
    other_id = f"{host}.{dead.pid}.other"  # dead too, but its records were meant for another collector
    envs_of = {}
    for cid in (orphan_id, live_id, other_id):
        buf = RecordBuffer()
        add_timers(buf, 0, 5)
        envs = [
            pb.Envelope(
                schema_version=1,
                client_id=cid,
                seq=1,
                hello=pb.Hello(run_id="old-run", run_name="old", rank=0, world_size=1),
            )
        ]
        ((table, cols, _n),) = buf.take()
        envs.append(
            pb.Envelope(schema_version=1, client_id=cid, seq=2, table=codec.encode_batch(table, "old-run", 0, cols))
        )
        envs_of[cid] = envs
    server, port, col = serve()
    endpoint = f"127.0.0.1:{port}"
    paths = {
        cid: spool.write(tmp_path, cid, envs, "10.9.9.9:50051" if cid == other_id else endpoint)
        for cid, envs in envs_of.items()
    }
    assert set(spool.orphans(tmp_path)) == {orphan_id, other_id}
    assert set(spool.orphans(tmp_path, endpoint)) == {orphan_id}
    try:
        client, buf = make_client(endpoint, tmp_path)
        assert col.wait_for(lambda: any(e.client_id == orphan_id for e in col.envelopes("table")))
        assert col.wait_for(
            lambda: sorted(spool.client_id_of(p) for p in spool.files(tmp_path)) == sorted([live_id, other_id])
        )
        assert end(client)
        old = [e for e in col.envelopes("table") if e.client_id == orphan_id]
        assert len(old) == 1 and old[0].table.rows == 5
        assert not any(e.client_id in (live_id, other_id) for e in col.received)
        assert paths[other_id].exists(), "a spool meant for another collector waits for that one"
    finally:
        server.stop(0)


def test_close_leaves_no_thread_in_grpc_and_no_call_for_the_last_collection(tmp_path):
    """After close, the ack reader and gRPC's thread that pulls the requests have left gRPC's code,
    and neither the stream nor the client holds a call or channel: a thread still inside at
    interpreter exit dies holding the call's lock, and the call's __del__ in the final garbage
    collection then waits for it forever (a Lightning rank that had finished training hung so at
    exit; later a 4-rank engine run's rank 1 with only the reader joined)."""
    import threading

    server, port, col = serve()
    try:
        client, buf = make_client(f"127.0.0.1:{port}", tmp_path)
        add_timers(buf, 0, 10)
        assert col.wait_for(lambda: col.rows("timers") is not None)
        stream = client._stream
        assert stream is not None and stream.reader.is_alive()
        feeder = stream._feeder
        assert feeder is not None and feeder.is_alive()
        assert end(client)
        assert not stream.reader.is_alive() and not feeder.is_alive()
        assert stream.call is None  # its __del__ ran then, not in the interpreter's last collection
        assert not [t.name for t in threading.enumerate() if t.name in ("rankscope-acks", "rankscope-client")]
        assert client._stream is None and client._channel is None
    finally:
        server.stop(0)
