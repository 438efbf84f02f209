"""A rank's Artifact envelope (its captured trace) at a real collector: stored under
D/artifacts with one ``artifacts`` row, once even when resent; refused with INVALID_ARGUMENT
naming the problem when its bytes are not gzip, its request id could name a path, it is for
another rank than the stream's, or it is over the bound; nothing of a refused one is written.
The Command RPC refuses out-of-bounds commands the same way."""

from __future__ import annotations

import gzip

import grpc
import pytest

from collector.server import artifacts
from collector.testing.collectors import live_collector, stored_rows
from collector.testing.fake_runs import envelope, hello
from collector.testing.streams import RawStream
from proto import pb, pb_grpc

TRACE = gzip.compress(b'{"traceEvents": []}')


def _artifact(cid, seq, rank=0, request_id="profile-1", data=TRACE):
    return envelope(
        cid,
        seq,
        artifact=pb.Artifact(
            run_id="run-a", rank=rank, request_id=request_id, kind="profile", first_step=5, last_step=7, data=data
        ),
    )


def test_an_artifact_is_stored_once_with_its_row(tmp_path):
    with live_collector(tmp_path / "data", grace_s=0) as collector:
        stream = RawStream(collector.channel())
        stream.send(hello("a0", 1, "run-a", 0, 2), _artifact("a0", 2))
        stream.finish()
        again = RawStream(collector.channel())  # a resend after a reconnect
        again.send(hello("a0", 1, "run-a", 0, 2), _artifact("a0", 2))
        again.finish()
        assert stream.acked == {1, 2} and again.acked == {1, 2}
    data = tmp_path / "data"
    assert (data / "artifacts/run=run-a/profile-1-rank0-profile.json.gz").read_bytes() == TRACE
    assert stored_rows(data, "artifacts") == 1
    assert not list((data / "artifacts").rglob(".*.tmp"))


@pytest.mark.parametrize(
    "bad, names",
    [
        (lambda: _artifact("a0", 2, data=b'{"traceEvents": []}'), "data is not gzip"),
        (lambda: _artifact("a0", 2, request_id="../../etc"), "request_id '../../etc' is not 1-64"),
        (lambda: _artifact("a0", 2, rank=1), "its artifact names run 'run-a' rank 1"),
        (lambda: _artifact("a0", 2, data=b"\x1f\x8b" + bytes(artifacts.MAX_ARTIFACT_BYTES)), "over the 48 MiB bound"),
    ],
)
def test_a_bad_artifact_is_refused_naming_why_and_nothing_is_written(tmp_path, bad, names):
    with live_collector(tmp_path / "data", grace_s=0) as collector:
        stream = RawStream(collector.channel([("grpc.max_send_message_length", 64 << 20)]))
        stream.send(hello("a0", 1, "run-a", 0, 2), bad())
        assert stream.done.wait(60)
        assert stream.error is not None and stream.error.code() == grpc.StatusCode.INVALID_ARGUMENT, stream.error
        assert names in stream.error.details()
    assert not (tmp_path / "data/artifacts").exists()
    assert stored_rows(tmp_path / "data", "artifacts") == 0


def test_a_command_out_of_bounds_or_for_a_rank_not_here_is_refused(tmp_path):
    with live_collector(tmp_path / "data", grace_s=0) as collector:
        stub = pb_grpc.CollectorStub(collector.channel())
        for request, names in (
            (pb.RankRequest(kind="profile", steps=21), "steps 21 is outside 1..20"),
            (pb.RankRequest(kind="format-disk"), "kind 'format-disk' is not one of profile, stacks, memory"),
        ):
            with pytest.raises(grpc.RpcError) as err:
                stub.Command(pb.CommandRequest(run_id="run-a", ranks=[0], request=request), timeout=30)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and names in err.value.details()
        reply = stub.Command(
            pb.CommandRequest(run_id="run-a", ranks=[0], request=pb.RankRequest(kind="stacks")), timeout=30
        )
        assert list(reply.sent) == [] and reply.refused == ["rank 0: no stream of run 'run-a' open on this collector"]
