"""A stream speaks for the one rank of one run its Hello declared, at a real collector: after a
Hello as run A rank 0 of 2, batches for another run, batches as rank 7, a RunEnd for another run
or rank and a second Hello as someone else are refused with INVALID_ARGUMENT naming both, and
nothing of them is stored (nor does a run appear that never said Hello). What a rank legitimately
sends still passes: its own Hello again on a new stream, its resends, and a spool file resent
without a Hello by another process (the client id's Hello names the rank)."""

from __future__ import annotations

import grpc
import pytest

from collector.data.codec import REJECTED_SEQ_KEY
from collector.testing.collectors import live_collector, stored_rows
from collector.testing.fake_runs import comm_envelope, hello, run_end
from collector.testing.streams import RawStream


def _foreign_run(cid, seq):
    return comm_envelope(cid, seq, "run-b", 0, 0, 5)


def _rank_outside_world(cid, seq):
    return comm_envelope(cid, seq, "run-a", 7, 0, 5)


def _other_rank(cid, seq):
    return comm_envelope(cid, seq, "run-a", 1, 0, 5)


def _end_of_another_run(cid, seq):
    return run_end(cid, seq, "run-b", 0)


def _end_of_another_rank(cid, seq):
    return run_end(cid, seq, "run-a", 1)


def _second_hello(cid, seq):
    return hello(cid, seq, "run-b", 0, 2)


@pytest.mark.parametrize(
    "intruder, names",
    [
        (_foreign_run, "table names run 'run-b' rank 0"),
        (_rank_outside_world, "table names run 'run-a' rank 7"),
        (_other_rank, "table names run 'run-a' rank 1"),
        (_end_of_another_run, "end names run 'run-b' rank 0"),
        (_end_of_another_rank, "end names run 'run-a' rank 1"),
        (_second_hello, "hello names run 'run-b' rank 0"),
    ],
)
def test_a_stream_sends_only_for_the_run_and_rank_its_hello_declared(tmp_path, intruder, names):
    with live_collector(tmp_path / "data", grace_s=0) as collector:
        stream = RawStream(collector.channel())
        stream.send(hello("a0", 1, "run-a", 0, 2), comm_envelope("a0", 2, "run-a", 0, 0, 10))
        stream.send(intruder("a0", 3), comm_envelope("a0", 4, "run-a", 0, 10, 10))
        assert stream.done.wait(30)
        err = stream.error
        assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert "envelope seq 3: this stream speaks for run 'run-a' rank 0 (by its Hello)" in err.details()
        assert names in err.details()
        assert dict(err.trailing_metadata())[REJECTED_SEQ_KEY] == "3"
        assert stream.acked == {1, 2}
    data = tmp_path / "data"
    assert stored_rows(data, "comm") == 10  # rank 0's first batch only
    assert stored_rows(data, "rank_ends") == 0
    assert stored_rows(data, "runs") == 1  # run-a's Hello, nothing of run-b
    assert not list((data / "parquet").glob("*/run=run-b"))


def test_a_stream_without_hello_speaks_for_its_clients_hello(tmp_path):
    """A dead rank's spool file resent by another process carries no Hello when the rank's Hello
    was acked before it spooled: its client id's Hello names the rank, and only that rank passes."""
    with live_collector(tmp_path / "data", grace_s=0) as collector:
        first = RawStream(collector.channel())
        first.send(hello("r1", 1, "run-a", 1, 2), comm_envelope("r1", 2, "run-a", 1, 0, 10))
        first.finish()
        assert first.acked == {1, 2}
        resend = RawStream(collector.channel())  # the spool file: seqs 2 (a resend), 3, 4
        resend.send(comm_envelope("r1", 2, "run-a", 1, 0, 10), comm_envelope("r1", 3, "run-a", 1, 10, 10))
        resend.send(run_end("r1", 4, "run-a", 1))
        resend.finish()
        assert resend.acked == {2, 3, 4} and resend.error is None
        wrong = RawStream(collector.channel())  # the same client id, as another rank
        wrong.send(comm_envelope("r1", 5, "run-a", 0, 20, 10))
        assert wrong.done.wait(30)
        assert wrong.error is not None and wrong.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "speaks for run 'run-a' rank 1 (by the Hello of client 'r1')" in wrong.error.details()
        # a client this collector never heard from, as rank 7 of the 2-rank run
        stranger = RawStream(collector.channel())
        stranger.send(comm_envelope("x", 1, "run-a", 7, 0, 10))
        assert stranger.done.wait(30)
        assert stranger.error is not None and stranger.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "rank 7 of run 'run-a', whose Hello declared world_size 2" in stranger.error.details()
    data = tmp_path / "data"
    assert stored_rows(data, "comm") == 20
    assert stored_rows(data, "rank_ends") == 1


def test_a_rank_reconnecting_with_its_hello_resends_as_before(tmp_path):
    with live_collector(tmp_path / "data", grace_s=0) as collector:
        first = RawStream(collector.channel())
        first.send(hello("r0", 1, "run-a", 0, 2), comm_envelope("r0", 2, "run-a", 0, 0, 10))
        assert first.wait_acked({1, 2})
        first.cancel()
        again = RawStream(collector.channel())  # the client's reconnect: Hello, then what is un-acked
        again.send(hello("r0", 1, "run-a", 0, 2), comm_envelope("r0", 2, "run-a", 0, 0, 10))
        again.send(comm_envelope("r0", 3, "run-a", 0, 10, 10), run_end("r0", 4, "run-a", 0))
        again.finish()
        assert again.acked == {1, 2, 3, 4} and again.error is None
    assert stored_rows(tmp_path / "data", "comm") == 20
