"""The wire codec decodes exactly what was encoded, at every batch size, against a reference built
with pyarrow from the same columns; and refuses a malformed column by name."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from collector.data.codec import CodecError, decode_batch, encode_batch
from collector.data.schema import ARROW_TYPES, TABLES
from collector.testing.fake_runs import FakeRun


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
