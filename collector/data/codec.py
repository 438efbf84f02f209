"""Columnar encoding of record batches for the wire (see proto/rankscope.proto).

``encode_batch`` turns columns (numpy arrays or Python sequences) into a
TableBatch; ``decode_batch`` validates one against ``schema.TABLES`` and
returns an Arrow table without copying the numeric buffers. Both sides share
this module so the format is defined in one place.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa

from collector.data import layout
from collector.data.schema import BOOL, F64, I64, STR, TABLES
from proto import pb

MAX_BATCH_ROWS = 1_000_000
_NP_DTYPES = {I64: np.dtype("<i8"), F64: np.dtype("<f8"), BOOL: np.dtype("u1")}


class CodecError(ValueError):
    """A batch that does not match the schema; the message says what and where."""


def check_run_id(run_id: str) -> str:
    try:
        return layout.check_run_id(run_id)
    except layout.RunIdError as exc:
        raise CodecError(str(exc)) from None


def encode_batch(table: str, run_id: str, rank: int, columns: Mapping[str, Sequence | np.ndarray]) -> pb.TableBatch:
    spec = TABLES[table].column_types
    rows = None
    out = pb.TableBatch(table=table, run_id=run_id, rank=rank)
    for name, values in columns.items():
        kind = spec[name]
        n = len(values)
        if rows is None:
            rows = n
        elif n != rows:
            raise CodecError(f"{table}.{name}: {n} values, other columns have {rows}")
        col = out.columns.add(name=name)
        if kind == STR:
            arr = pa.array(values, pa.string()).dictionary_encode()
            col.str.dictionary.extend(arr.dictionary.to_pylist())
            col.str.codes = arr.indices.to_numpy(zero_copy_only=False).astype("<u4").tobytes()
        else:
            setattr(col, kind, np.asarray(values, dtype=_NP_DTYPES[kind]).tobytes())
    out.rows = rows or 0
    return out


def _decode_column(table: str, col: pb.Column, kind: str, rows: int) -> pa.Array:
    where = f"{table}.{col.name}"
    present = col.WhichOneof("values")
    if present != kind:
        raise CodecError(f"{where}: expected type {kind}, got {present or 'no values'}")
    if kind == STR:
        codes = col.str.codes
        if len(codes) != rows * 4:
            raise CodecError(f"{where}: {len(codes)} code bytes, expected {rows * 4} ({rows} rows x 4)")
        idx = np.frombuffer(codes, dtype="<u4")
        ndict = len(col.str.dictionary)
        if rows and (ndict == 0 or int(idx.max()) >= ndict):
            raise CodecError(f"{where}: string code out of range (dictionary has {ndict} entries)")
        return pa.array(list(col.str.dictionary), pa.string()).take(pa.array(idx))
    data = getattr(col, kind)
    width = _NP_DTYPES[kind].itemsize
    if len(data) != rows * width:
        raise CodecError(f"{where}: {len(data)} bytes, expected {rows * width} ({rows} rows x {width})")
    values = np.frombuffer(data, dtype=_NP_DTYPES[kind])
    return pa.array(values.astype(bool) if kind == BOOL else values)


def decode_batch(batch: pb.TableBatch) -> pa.Table:
    """Validate and convert one batch. Raises CodecError naming the problem."""
    spec = TABLES.get(batch.table)
    if spec is None:
        raise CodecError(f"unknown table {batch.table!r}; known: {', '.join(TABLES)}")
    check_run_id(batch.run_id)
    if batch.rank < 0:
        raise CodecError(f"rank {batch.rank} is negative")
    rows = batch.rows
    if rows > MAX_BATCH_ROWS:
        raise CodecError(f"{rows} rows in one batch; the limit is {MAX_BATCH_ROWS}")
    types = spec.column_types
    arrays: dict[str, pa.Array] = {}
    for col in batch.columns:
        if col.name not in types:
            raise CodecError(f"{batch.table}: unknown column {col.name!r}")
        if col.name in arrays:
            raise CodecError(f"{batch.table}: column {col.name!r} sent twice")
        arrays[col.name] = _decode_column(batch.table, col, types[col.name], rows)
    schema = spec.arrow_schema()
    data = [pa.array(np.full(rows, batch.rank, dtype=np.int64))]
    for field in list(schema)[1:]:
        # Columns a client did not send (an older client) are stored as nulls.
        data.append(arrays.get(field.name, pa.nulls(rows, field.type)))
    return pa.Table.from_arrays(data, schema=schema)
