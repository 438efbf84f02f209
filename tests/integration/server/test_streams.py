"""The collector's stream limits, against a real server on a real port with real clients:
idle streams cannot lock out ranks or Health, silent streams are closed, one peer cannot
hold more than its share, and a flooding stream is held to its budget.

Split by tier: the pure-function tests are in tests/unit/server/test_streams.py."""

from __future__ import annotations

import os
import time

import grpc
import pytest

from collector.data import security
from collector.rank.client import Client, ClientConfig
from collector.rank.records import RecordBuffer
from collector.server.limits import StreamLimits
from collector.testing.collectors import live_collector, stored_rows
from collector.testing.fake_runs import FakeRun, comm_envelope, hello, stream
from collector.testing.streams import HeldStreams, RawStream
from proto import pb, pb_grpc

TOKEN = "t" * 32


def _health(endpoint: str, token: str | None = None) -> tuple[pb.HealthReply, float]:
    with grpc.insecure_channel(endpoint) as channel:
        stub = pb_grpc.CollectorStub(channel)
        stub.Health(pb.HealthRequest(), metadata=security.auth_metadata(token), timeout=30)  # connected
        began = time.monotonic()
        reply = stub.Health(pb.HealthRequest(), metadata=security.auth_metadata(token), timeout=30)
        return reply, time.monotonic() - began


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.05)


def test_a_thousand_idle_streams_lock_out_neither_a_rank_nor_health(tmp_path):
    run = FakeRun(run_id="busy", world_size=2, steps=5)
    with live_collector(tmp_path / "data", token=TOKEN) as collector:
        with HeldStreams(collector.endpoint, 1000, metadata=security.auth_metadata(TOKEN)):
            _wait(lambda: collector.state.open_streams >= 1000, 120, "1000 open streams")
            stream(collector.endpoint, run, token=TOKEN)  # a real rank per stream, returns once all is acked
            reply, took = _health(collector.endpoint, TOKEN)
            assert reply.open_streams >= 1000
            assert took < 1.0, f"Health took {took:.2f} s with 1000 idle streams open"
        _wait(lambda: collector.state.open_streams == 0, 60, "the held streams to close")
    assert stored_rows(tmp_path / "data") == run.world_size * run.instances


def test_a_silent_stream_is_closed_after_the_idle_timeout_and_a_talking_one_is_not(tmp_path):
    limits = StreamLimits(idle_timeout_s=1.0)
    with live_collector(tmp_path / "data", stream_limits=limits) as collector:
        silent = RawStream(collector.channel())
        talking = RawStream(collector.channel())
        talking.send(hello("talker", 1, "r", 0, 1))
        began = time.monotonic()
        for seq in range(2, 12):  # a message every 0.3 s for 3 s: never 1 s apart
            talking.send(comm_envelope("talker", seq, "r", 0, seq * 10, 10))
            time.sleep(0.3)
        assert silent.done.wait(30), "the silent stream was not closed"
        assert silent.error.code() == grpc.StatusCode.UNAVAILABLE
        assert "--stream-idle-timeout" in silent.error.details()
        assert not talking.done.is_set(), f"the talking stream ended: {talking.error}"
        assert time.monotonic() - began >= 1.0
        talking.finish()
        assert talking.error is None and talking.acked == set(range(1, 12))


def test_the_stream_over_the_per_peer_limit_is_refused_with_the_limit_named(tmp_path):
    with live_collector(tmp_path / "data", stream_limits=StreamLimits(max_streams_per_peer=3)) as collector:
        with HeldStreams(collector.endpoint, 3):
            _wait(lambda: collector.state.open_streams == 3, 30, "3 open streams")
            fourth = RawStream(collector.channel())
            assert fourth.done.wait(30)
            assert fourth.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_streams_per_peer = 3" in fourth.error.details()
            assert collector.state.open_streams == 3
        _wait(lambda: collector.state.open_streams == 0, 30, "the held streams to close")
        again = RawStream(collector.channel())  # the peer's streams are counted down when they end
        again.send(hello("c", 1, "r", 0, 1))
        again.finish()
        assert again.error is None and again.acked == {1}


@pytest.mark.timing
def test_a_flooding_stream_is_held_to_its_row_budget_with_bounded_memory(tmp_path):
    rows_per_s, batch = 20_000, 2_000
    limits = StreamLimits(rows_per_s=rows_per_s)
    with live_collector(tmp_path / "data", stream_limits=limits) as collector:
        flood = RawStream(collector.channel())
        flood.send(hello("flood", 1, "r", 0, 1))
        flood.send(*(comm_envelope("flood", seq, "r", 0, seq * batch, batch) for seq in range(2, 202)))  # 400k rows
        calm = RawStream(collector.channel())  # another stream is not slowed by the flood
        calm.send(hello("calm", 1, "r2", 0, 1), comm_envelope("calm", 2, "r2", 0, 0, 100))
        assert calm.wait_acked({1, 2}, timeout=30)
        began = time.monotonic()
        rss_before = _rss_bytes()
        time.sleep(3.0)
        acked_rows = (len(flood.acked) - 1) * batch
        elapsed = time.monotonic() - began
        # one second of burst, the budget since, and the envelope in hand
        assert acked_rows <= rows_per_s * (elapsed + 1.0 + 0.5) + batch, (acked_rows, elapsed)
        assert acked_rows >= rows_per_s * 1.0, f"the flood is starved, not throttled: {acked_rows} rows"
        assert _rss_bytes() - rss_before < 200 << 20
        assert not flood.done.is_set()
        flood.cancel()
        calm.finish()


def _rank_client(endpoint: str, spool_dir) -> tuple[Client, RecordBuffer]:
    cfg = ClientConfig(
        endpoint=endpoint,
        spool_dir=spool_dir,
        flush_interval_s=0.05,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        close_timeout_s=10.0,
    )
    buf = RecordBuffer(max_rows=100_000)
    return Client(cfg, "rank.0", buf), buf


def _add_timers(buf: RecordBuffer, steps: range) -> None:
    for i in steps:
        buf.add_row("timers", {"name": "fwd", "start_ns": i, "dur_ns": 1}, step=i)


def test_a_real_rank_refused_by_the_peer_limit_retries_and_loses_nothing(tmp_path):
    with live_collector(tmp_path / "data", stream_limits=StreamLimits(max_streams_per_peer=1)) as collector:
        client, buf = _rank_client(collector.endpoint, tmp_path / "spool")
        with HeldStreams(collector.endpoint, 1):  # the peer's one stream is taken
            _wait(lambda: collector.state.open_streams == 1, 30, "the held stream")
            client.start(pb.Hello(run_id="r", rank=0, world_size=1))
            _add_timers(buf, range(300))
            time.sleep(1.0)  # refused, retried with backoff, spooled
            assert client.acked == 0
        _add_timers(buf, range(300, 600))
        assert client.close(pb.RunEnd(run_id="r", rank=0, status="finished"))
    assert stored_rows(tmp_path / "data", "timers") == 600


def test_a_real_rank_closed_as_idle_reconnects_and_loses_nothing(tmp_path):
    with live_collector(tmp_path / "data", stream_limits=StreamLimits(idle_timeout_s=0.5)) as collector:
        client, buf = _rank_client(collector.endpoint, tmp_path / "spool")
        client.start(pb.Hello(run_id="r", rank=0, world_size=1))
        _add_timers(buf, range(300))
        _wait(lambda: client.acked >= 2 and client.pending == 0, 60, "the first records to be acked")
        _wait(lambda: collector.state.open_streams == 0, 30, "the silent rank's stream to be closed")
        _add_timers(buf, range(300, 600))
        assert client.close(pb.RunEnd(run_id="r", rank=0, status="finished"))
    assert stored_rows(tmp_path / "data", "timers") == 600


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
