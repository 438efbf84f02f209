"""collector.testing's plumbing: a live collector that really listens, stores and stops
(and unpacks as (endpoint, data_dir)), the raw stream driving it, stored_rows counting
committed segments without the catalog, and free ports that really are free.

Split by tier: the pure-function tests are in tests/unit/testing/test_collectors.py."""

from __future__ import annotations

import socket

import grpc
import pytest

from collector.data import catalog
from collector.testing.collectors import live_collector, stored_rows
from collector.testing.fake_runs import comm_envelope, hello, run_end
from collector.testing.ports import free_port
from collector.testing.streams import RawStream
from proto import pb, pb_grpc


def test_a_live_collector_acks_stores_and_stops(tmp_path):
    with live_collector(tmp_path / "data") as collector:
        endpoint, data_dir = collector
        assert endpoint == f"127.0.0.1:{collector.port}" and data_dir == tmp_path / "data"
        channel = collector.channel()
        assert pb_grpc.CollectorStub(channel).Health(pb.HealthRequest(), timeout=10).schema_version > 0
        stream = RawStream(channel)
        stream.send(hello("c", 1, "run", 0, 1), comm_envelope("c", 2, "run", 0, 0, 25), run_end("c", 3, "run", 0))
        stream.finish()
        assert stream.error is None and stream.acked == {1, 2, 3}
        assert stored_rows(data_dir) == 25 and stored_rows(data_dir, "rank_ends") == 1
    assert catalog.connect(tmp_path / "data").execute("SELECT status FROM runs").fetchall() == [("finished",)]
    with pytest.raises(ValueError, match="closed channel"):  # closed with the collector
        pb_grpc.CollectorStub(channel).Health(pb.HealthRequest(), timeout=2)
    with grpc.insecure_channel(endpoint) as after, pytest.raises(grpc.RpcError) as gone:
        pb_grpc.CollectorStub(after).Health(pb.HealthRequest(), timeout=2)
    assert gone.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_a_token_collector_refuses_a_stream_without_it(tmp_path):
    with live_collector(tmp_path / "data", token="s3cret") as collector:
        stream = RawStream(collector.channel())
        stream.send(hello("c", 1, "run", 0, 1))
        stream.finish()
        assert stream.error.code() == grpc.StatusCode.UNAUTHENTICATED and not stream.acked
        allowed = RawStream(collector.channel(), metadata=[("authorization", "Bearer s3cret")])
        allowed.send(hello("c", 1, "run", 0, 1))
        allowed.finish()
        assert allowed.acked == {1}


def test_the_fixture_is_a_live_collector(live_collector):
    endpoint, data_dir = live_collector
    with grpc.insecure_channel(endpoint) as channel:
        assert pb_grpc.CollectorStub(channel).Health(pb.HealthRequest(), timeout=10).schema_version > 0
    assert (data_dir / "catalog.duckdb").exists()


def test_free_port_is_bindable_right_away():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert 0 < port < 65536
