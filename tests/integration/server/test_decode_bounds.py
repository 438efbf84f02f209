"""What one envelope may cost the collector, at a real collector on a real port: a batch whose
string codes all point at one long dictionary entry (90 KB on the wire, 200 MB decoded) is refused
with INVALID_ARGUMENT naming the column before it is decoded, nothing of it is stored, the
collector's memory does not grow by the decoded size, and other streams go on; a Hello whose
strings are over their caps is refused naming the field; a batch with impossible values (a
collective ending before it started) is refused naming the column and row."""

from __future__ import annotations

import resource

import grpc
import numpy as np
import pytest

from collector.data import codec
from collector.data.codec import REJECTED_SEQ_KEY, encode_batch
from collector.testing.collectors import live_collector, stored_rows
from collector.testing.fake_runs import comm_envelope, envelope, hello
from collector.testing.streams import RawStream


def _amplifying(client: str, seq: int, run_id: str, rows: int = 20_000, entry: int = 10_000):
    batch = encode_batch("comm", run_id, 0, {"op": ["x"] * rows})
    batch.columns[0].str.dictionary[0] = "y" * entry
    return envelope(client, seq, table=batch)


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_a_batch_that_decodes_to_200_mb_is_refused_by_column_before_it_is_decoded(tmp_path):
    with live_collector(tmp_path / "data", grace_s=0) as collector:
        healthy = RawStream(collector.channel())
        healthy.send(hello("ok", 1, "fine", 0, 1), comm_envelope("ok", 2, "fine", 0, 0, 10))
        assert healthy.wait_acked({1, 2})
        bad = RawStream(collector.channel())
        env = _amplifying("amp", 2, "amp")
        assert env.ByteSize() < 100_000
        peak = _peak_rss_bytes()
        bad.send(hello("amp", 1, "amp", 0, 1), env, comm_envelope("amp", 3, "amp", 0, 0, 5))
        assert bad.done.wait(30)
        err = bad.error
        assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert "envelope seq 2: comm.op: 20000 rows decode to 200000000 string bytes" in err.details()
        assert dict(err.trailing_metadata())[REJECTED_SEQ_KEY] == "2"
        assert bad.acked == {1}
        # the collector (this process) never held the decoded column
        assert _peak_rss_bytes() - peak < 100 << 20
        # the same stream's neighbour goes on
        healthy.send(comm_envelope("ok", 3, "fine", 0, 10, 10))
        assert healthy.wait_acked({3})
        healthy.finish()
    data = tmp_path / "data"
    assert stored_rows(data, "comm") == 20  # "fine"'s, nothing of "amp"


def test_the_stream_that_overflowed_arrow_gets_a_named_refusal_not_internal(tmp_path):
    """1.1 MB on the wire: codes of a 250,000-row column into one 10 KB entry (2.5 GB decoded,
    past what one Arrow string array holds): INVALID_ARGUMENT, not INTERNAL with a traceback."""
    with live_collector(tmp_path / "data", grace_s=0) as collector:
        bad = RawStream(collector.channel())
        env = _amplifying("amp", 1, "amp", rows=250_000)
        assert env.ByteSize() < 1_200_000
        peak = _peak_rss_bytes()
        bad.send(env)
        assert bad.done.wait(30)
        assert bad.error is not None and bad.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "comm.op" in bad.error.details() and "the limit is" in bad.error.details()
        assert _peak_rss_bytes() - peak < 100 << 20
    assert stored_rows(tmp_path / "data", "comm") == 0


@pytest.mark.parametrize("field", sorted(codec.HELLO_LIMITS))
def test_an_oversized_hello_string_is_refused_by_name_and_a_long_enough_one_is_stored(tmp_path, field):
    limit = codec.HELLO_LIMITS[field]
    with live_collector(tmp_path / "data", grace_s=0) as collector:
        too_long = RawStream(collector.channel())
        too_long.send(hello("big", 1, "big", 0, 1, **{field: "n" * (limit + 1)}))
        assert too_long.done.wait(30)
        err = too_long.error
        assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"hello.{field} is {limit + 1} characters; the limit is {limit}" in err.details()
        at_limit = RawStream(collector.channel())
        at_limit.send(hello("fits", 1, "fits", 0, 1, **{field: "n" * limit}))
        at_limit.finish()
        assert at_limit.acked == {1} and at_limit.error is None
    assert stored_rows(tmp_path / "data", "runs") == 1


def test_a_million_row_batch_of_one_bool_column_is_refused_by_its_row_count(tmp_path):
    """1 MB on the wire; every other column of a million comm rows would be stored as nulls."""
    rows = 1_000_000
    with live_collector(tmp_path / "data", grace_s=0) as collector:
        bad = RawStream(collector.channel())
        bad.send(envelope("b", 1, table=encode_batch("comm", "b", 0, {"async_op": np.zeros(rows, dtype=bool)})))
        assert bad.done.wait(60)
        assert bad.error is not None and bad.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"table.rows: {rows} rows of comm decode to" in bad.error.details()
    assert stored_rows(tmp_path / "data", "comm") == 0


def test_a_collective_ending_before_it_started_is_refused_by_row_and_nothing_of_it_is_stored(tmp_path):
    columns = {"step": [1, 2, 3], "op": ["all_reduce"] * 3, "start_ns": [100, 200, 300], "end_ns": [150, 250, 299]}
    with live_collector(tmp_path / "data", grace_s=0) as collector:
        rank = RawStream(collector.channel())
        rank.send(hello("p", 1, "p", 0, 1), envelope("p", 2, table=encode_batch("comm", "p", 0, columns)))
        assert rank.done.wait(30)
        err = rank.error
        assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "envelope seq 2: comm.end_ns: row 2 ends at 299, before its start_ns 300" in err.details()
        assert dict(err.trailing_metadata())[REJECTED_SEQ_KEY] == "2" and rank.acked == {1}
    assert stored_rows(tmp_path / "data", "comm") == 0
