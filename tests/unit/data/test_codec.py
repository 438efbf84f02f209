"""The wire codec decodes exactly what was encoded, at every batch size, against a reference built
with pyarrow from the same columns; and refuses a malformed column by name."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from collector.data.codec import CodecError, decode_batch, encode_batch, envelope_rows
from collector.data.schema import ARROW_TYPES, TABLES
from collector.testing.fake_runs import FakeRun
from proto import pb


def reference(table: str, rank: int, columns: dict) -> pa.Table:
    """What decode_batch must return: every schema column from ``columns`` by pa.array, nulls
    for the ones not sent, rank from the header."""
    rows = len(next(iter(columns.values())))
    spec = TABLES[table]
    data = [pa.array([rank] * rows, pa.int64())]
    for name, kind in spec.columns:
        t = ARROW_TYPES[kind]
        data.append(pa.array(np.asarray(columns[name]).tolist(), t) if name in columns else pa.nulls(rows, t))
    return pa.Table.from_arrays(data, schema=spec.arrow_schema())


@pytest.mark.parametrize("rows", [0, 1, 7, 100, 16384])
def test_a_comm_batch_decodes_to_what_was_encoded(rows):
    columns = FakeRun(run_id="r", world_size=16).comm_columns(5, 0, rows)
    columns["async_op"] = np.arange(rows) % 3 == 0  # both truth values, bit-packed in Arrow
    got = decode_batch(encode_batch("comm", "r", 5, columns))
    got.validate(full=True)
    assert got.equals(reference("comm", 5, columns))


def test_columns_not_sent_are_null_and_strings_repeat_from_the_dictionary():
    columns = {"step": [3, 3, 4], "op": ["all_reduce", "broadcast", "all_reduce"], "bytes": [1, 2, 3]}
    got = decode_batch(encode_batch("comm", "r", 2, columns))
    assert got.equals(reference("comm", 2, columns))
    assert got.column("group_name").null_count == 3 and got.column("rank").to_pylist() == [2, 2, 2]


def test_a_string_code_past_the_dictionary_is_refused_by_column():
    batch = encode_batch("comm", "r", 0, {"step": [1, 2], "op": ["a", "b"]})
    op = next(c for c in batch.columns if c.name == "op")
    op.str.codes = np.array([0, 7], dtype="<u4").tobytes()
    with pytest.raises(CodecError, match=r"comm\.op: string code out of range \(dictionary has 2 entries\)"):
        decode_batch(batch)
    del op.str.dictionary[:]
    with pytest.raises(CodecError, match=r"comm\.op: string code out of range \(dictionary has 0 entries\)"):
        decode_batch(batch)
    op.str.codes = b"\0" * 5
    with pytest.raises(CodecError, match=r"comm\.op: 5 code bytes, expected 8"):
        decode_batch(batch)


def _one_long_entry(rows: int, entry_bytes: int) -> pb.TableBatch:
    """A comm batch whose op codes all point at one long dictionary entry: a few bytes a row on
    the wire, ``entry_bytes`` a row decoded."""
    batch = encode_batch("comm", "r", 0, {"op": ["x"] * rows})
    batch.columns[0].str.dictionary[0] = "y" * entry_bytes
    return batch


def test_a_string_column_decoding_past_its_bound_is_refused_before_anything_is_allocated():
    # 90 KB on the wire, 200 MB decoded: refused by column, with no Arrow memory taken for it
    batch = _one_long_entry(20_000, 10_000)
    assert batch.ByteSize() < 100_000
    before = pa.total_allocated_bytes()
    with pytest.raises(CodecError, match=r"comm\.op: 20000 rows decode to 200000000 string bytes; the limit is"):
        decode_batch(batch)
    assert pa.total_allocated_bytes() - before < 1 << 20
    # the same entry, a few rows: fine
    assert decode_batch(_one_long_entry(100, 10_000)).column("op")[99].as_py() == "y" * 10_000


def test_the_bound_counts_what_the_codes_point_at_not_the_longest_entry():
    """Only when the cheap bound (longest entry x rows) is over the budget are the codes summed:
    many rows of a short entry beside one long entry used once decode as they should."""
    rows = 100_000
    batch = encode_batch("comm", "r", 0, {"step": np.zeros(rows, dtype=np.int64), "op": ["a"] * (rows - 1) + ["b"]})
    op = next(c for c in batch.columns if c.name == "op")
    op.str.dictionary[1] = "z" * 500_000  # bound: 50 GB; what the codes take: 600 KB
    got = decode_batch(batch)
    assert got.column("op")[rows - 1].as_py() == "z" * 500_000 and got.column("op")[0].as_py() == "a"
    # codes past the dictionary are still named as such on that path
    op.str.codes = np.full(rows, 9, dtype="<u4").tobytes()
    with pytest.raises(CodecError, match=r"comm\.op: string code out of range \(dictionary has 2 entries\)"):
        decode_batch(batch)


def test_the_envelope_bound_sums_its_columns_and_names_the_one_over_it():
    # each string column under the per-column bound, together over the envelope's
    rows, entry = 2_000, 9_000  # 18 MB per column
    columns = {"step": np.zeros(rows, dtype=np.int64)}
    columns.update({name: ["x"] * rows for name in ("group_name", "op", "log_name", "dtype")})
    batch = encode_batch("comm", "r", 0, columns)
    for col in batch.columns:
        if col.WhichOneof("values") == "str":
            col.str.dictionary[0] = "y" * entry
    with pytest.raises(CodecError, match=r"comm\.(log_name|dtype): 2000 rows decode to 18000000 string bytes, over"):
        decode_batch(batch)


def test_rows_with_no_strings_are_bounded_too_and_one_value_is_capped():
    # a bool column costs 1 byte a row on the wire; every other column of those rows is stored as null
    rows = 1_000_000
    batch = encode_batch("comm", "r", 0, {"async_op": np.zeros(rows, dtype=bool)})
    with pytest.raises(CodecError, match=r"table\.rows: 1000000 rows of comm decode to \d+ bytes before any string"):
        decode_batch(batch)
    with pytest.raises(CodecError, match=r"comm\.op: dictionary entry 0 is 1048577 bytes; the limit is 1048576"):
        decode_batch(_one_long_entry(1, (1 << 20) + 1))


@pytest.mark.parametrize(
    "field, value",
    [
        ("run_name", "n" * 1_000_000),
        ("host", "h" * 256),
        ("source", "s" * 65),
        ("config_json", "{" + " " * (1 << 20) + "}"),
        ("linked_run_id", "../elsewhere"),
    ],
)
def test_hello_strings_are_capped_by_name(field, value):
    env = pb.Envelope(
        schema_version=1, client_id="c", seq=1, hello=pb.Hello(run_id="r", rank=0, world_size=1, **{field: value})
    )
    with pytest.raises(CodecError, match=rf"envelope seq 1: hello\.{field}"):
        envelope_rows(env)
    setattr(env.hello, field, value[:10].replace(".", "x").replace("/", "x"))
    assert [t for t, _, _ in envelope_rows(env)] == ["runs", "ranks"]


@pytest.mark.parametrize(
    "table, column, bad, message",
    [
        ("timers", "dur_ns", -5, r"timers\.dur_ns: row 2 is -5; a time or duration cannot be negative"),
        ("monitor", "time_ns", -1, r"monitor\.time_ns: row 2 is -1; a time or duration cannot be negative"),
        ("comm", "end_ns", 999, r"comm\.end_ns: row 2 ends at 999, before its start_ns 1000"),
        ("comm", "busbw_gbs", float("nan"), r"comm\.busbw_gbs: row 2 is nan; expected a finite number"),
        ("comm", "algbw_gbs", float("-inf"), r"comm\.algbw_gbs: row 2 is -inf; expected a finite number"),
    ],
)
def test_impossible_values_are_refused_by_column_and_row(table, column, bad, message):
    columns = {"step": [1, 2, 3, 4]}
    if table == "timers":
        columns.update(name=["fwd"] * 4, start_ns=[1000] * 4, dur_ns=[10, 20, 30, 40])
    elif table == "monitor":
        columns.update(tag=["loss"] * 4, value=[float("nan"), 1.0, 0.5, float("inf")], time_ns=[1, 2, 3, 4])
    else:
        columns.update(start_ns=[1000] * 4, end_ns=[1000, 1001, 1002, 1003], algbw_gbs=[1.0] * 4, busbw_gbs=[1e308] * 4)
    assert decode_batch(encode_batch(table, "r", 0, columns)).num_rows == 4  # a NaN loss is a real signal
    columns[column] = list(columns[column])
    columns[column][2] = bad
    with pytest.raises(CodecError, match=message):
        decode_batch(encode_batch(table, "r", 0, columns))


@pytest.mark.parametrize("ended_by, stored", [("", "rank"), ("rank", "rank"), ("supervisor", "supervisor")])
def test_a_run_end_says_who_sent_it(ended_by, stored):
    """The rank's own RunEnd (an older sender leaves ended_by empty) or one recorded for it by
    whoever stopped the run (collector.tools.supervise): rank_ends keeps which."""
    end = pb.RunEnd(run_id="r", rank=1, status="stopped", ended_at_ns=5, ended_by=ended_by)
    [(table, run_id, row)] = envelope_rows(pb.Envelope(schema_version=1, client_id="c", seq=3, end=end))
    assert (table, run_id, row.column("ended_by").to_pylist()) == ("rank_ends", "r", [stored])


def test_a_run_end_from_an_unknown_sender_is_refused_by_name():
    end = pb.RunEnd(run_id="r", rank=1, status="stopped", ended_at_ns=5, ended_by="someone")
    with pytest.raises(CodecError, match=r"envelope seq 3: run end: ended_by 'someone' is not one of rank, supervisor"):
        envelope_rows(pb.Envelope(schema_version=1, client_id="c", seq=3, end=end))
