"""Bad input ends only the stream that sent it, with the right status and a clear message."""

from __future__ import annotations

import contextlib

import grpc
import pytest

from collector.data.codec import REJECTED_SEQ_KEY
from collector.server.service import MAX_MESSAGE_BYTES, create_server
from collector.testing.collectors import live_collector, stored_rows
from collector.testing.fake_runs import comm_envelope, hello
from collector.testing.streams import RawStream
from proto import pb, pb_grpc


@pytest.fixture
def served(tmp_path):
    """start(token=None) -> (channel, state): a collector over tmp_path/data whose channel may send
    messages twice the size the collector accepts."""
    with contextlib.ExitStack() as running:

        def start(token=None):
            live = running.enter_context(live_collector(tmp_path / "data", token=token, grace_s=0))
            return live.channel(options=[("grpc.max_send_message_length", 2 * MAX_MESSAGE_BYTES)]), live.state

        yield start


def _short_column(env: pb.Envelope) -> pb.Envelope:
    env.table.columns[0].i64 = env.table.columns[0].i64[:-3]
    return env


def _unknown_table(env: pb.Envelope) -> pb.Envelope:
    env.table.table = "no_such_table"
    return env


def _bad_run_id(env: pb.Envelope) -> pb.Envelope:
    env.table.run_id = "../etc"
    return env


def _unknown_column(env: pb.Envelope) -> pb.Envelope:
    env.table.columns.add(name="nonsense", i64=b"\0" * 8 * env.table.rows)
    return env


def _wrong_schema_version(env: pb.Envelope) -> pb.Envelope:
    env.schema_version = 2
    return env


def _no_body(env: pb.Envelope) -> pb.Envelope:
    env.ClearField("table")
    return env


def _bad_hello(env: pb.Envelope) -> pb.Envelope:
    return hello(env.client_id, env.seq, "r", rank=5, world_size=4)


@pytest.mark.parametrize(
    "spoil, code, words",
    [
        (_short_column, grpc.StatusCode.INVALID_ARGUMENT, ["comm.step", "bytes, expected"]),
        (_unknown_table, grpc.StatusCode.INVALID_ARGUMENT, ["unknown table 'no_such_table'"]),
        (_bad_run_id, grpc.StatusCode.INVALID_ARGUMENT, ["run_id '../etc'"]),
        (_unknown_column, grpc.StatusCode.INVALID_ARGUMENT, ["unknown column 'nonsense'"]),
        (_no_body, grpc.StatusCode.INVALID_ARGUMENT, ["no body"]),
        (_bad_hello, grpc.StatusCode.INVALID_ARGUMENT, ["rank 5", "world_size=4"]),
        (_wrong_schema_version, grpc.StatusCode.FAILED_PRECONDITION, ["schema_version 2", "schema_version 1"]),
    ],
)
def test_a_bad_envelope_ends_its_stream_only(served, tmp_path, spoil, code, words):
    channel, _state = served()
    healthy = RawStream(channel)
    healthy.send(comm_envelope("healthy", 1, "r", 1, 0, 10))
    assert healthy.wait_acked([1])

    bad = RawStream(channel)
    bad.send(comm_envelope("bad", 1, "r", 0, 0, 10), comm_envelope("bad", 2, "r", 0, 10, 10))
    bad.send(spoil(comm_envelope("bad", 3, "r", 0, 20, 10)))
    bad.send(comm_envelope("bad", 4, "r", 0, 30, 10))  # after the bad one: never read
    assert bad.done.wait(30)
    err = bad.error
    assert err is not None and err.code() == code
    assert "seq 3" in err.details()
    for w in words:
        assert w in err.details()
    assert dict(err.trailing_metadata())[REJECTED_SEQ_KEY] == "3"
    # What came before the bad envelope was committed and acked before the stream closed.
    assert bad.acked == {1, 2}

    healthy.send(comm_envelope("healthy", 2, "r", 1, 10, 10))
    healthy.finish()
    assert healthy.error is None and healthy.acked == {1, 2}
    assert stored_rows(tmp_path / "data") == 40
    health = pb_grpc.CollectorStub(channel).Health(pb.HealthRequest())
    assert health.batches_rejected == 1


def test_an_oversized_message_is_refused_with_resource_exhausted(served, tmp_path):
    channel, _ = served()
    healthy = RawStream(channel)
    healthy.send(comm_envelope("healthy", 1, "r", 1, 0, 10))
    big = RawStream(channel)
    big.send(comm_envelope("big", 1, "r", 0, 0, 10))
    assert big.wait_acked([1])
    huge = comm_envelope("big", 2, "r", 0, 10, 1)
    huge.table.columns[0].i64 = b"\0" * (MAX_MESSAGE_BYTES + 1024)
    big.send(huge)
    assert big.done.wait(30)
    assert big.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    healthy.send(comm_envelope("healthy", 2, "r", 1, 10, 10))
    healthy.finish()
    assert healthy.acked == {1, 2}
    assert stored_rows(tmp_path / "data") == 30


def test_a_token_is_required_when_the_collector_has_one(served, tmp_path):
    channel, _ = served(token="s3cret")
    stub = pb_grpc.CollectorStub(channel)
    for metadata in (None, (("authorization", "Bearer wrong"),), (("authorization", "s3cret"),)):
        with pytest.raises(grpc.RpcError) as info:
            stub.Health(pb.HealthRequest(), metadata=metadata)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "bearer token" in info.value.details()
        denied = RawStream(channel, metadata=metadata)
        denied.send(comm_envelope("c", 1, "r", 0, 0, 10))
        assert denied.done.wait(30)
        assert denied.error.code() == grpc.StatusCode.UNAUTHENTICATED and not denied.acked

    good = (("authorization", "Bearer s3cret"),)
    assert stub.Health(pb.HealthRequest(), metadata=good).schema_version == 1
    allowed = RawStream(channel, metadata=good)
    allowed.send(comm_envelope("c", 1, "r", 0, 0, 10))
    allowed.finish()
    assert allowed.acked == {1}
    assert stored_rows(tmp_path / "data") == 10


def test_a_second_collector_on_the_same_data_dir_is_refused(served, tmp_path):
    served()
    with pytest.raises(RuntimeError, match="in use by another collector"):
        create_server("127.0.0.1:0", tmp_path / "data")


def test_a_failed_commit_is_not_acked_and_the_resend_is_stored_once(served, tmp_path, monkeypatch):
    import collector.server.store as store_module

    real_write = store_module.write_segment
    failures = []

    def disk_full_once(final, schema, tables):
        if not failures:
            failures.append(final)
            raise OSError(28, "No space left on device")
        return real_write(final, schema, tables)

    monkeypatch.setattr(store_module, "write_segment", disk_full_once)
    channel, _ = served()
    s = RawStream(channel)
    s.send(hello("c", 1, "r", 0, 1), comm_envelope("c", 2, "r", 0, 0, 10))
    assert s.done.wait(30)
    assert s.error.code() == grpc.StatusCode.UNAVAILABLE and "resend" in s.error.details()
    assert REJECTED_SEQ_KEY not in dict(s.error.trailing_metadata())
    assert not s.acked

    again = RawStream(channel)
    again.send(hello("c", 1, "r", 0, 1), comm_envelope("c", 2, "r", 0, 0, 10))
    again.finish()
    assert again.acked == {1, 2}
    assert stored_rows(tmp_path / "data") == 10
    assert stored_rows(tmp_path / "data", "runs") == 1
