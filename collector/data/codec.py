"""The wire's rules, in one place for both ends (see proto/rankscope.proto).

``encode_batch`` turns columns (numpy arrays or Python sequences) into a
TableBatch; ``decode_batch`` validates one against ``schema.TABLES`` and
returns an Arrow table without copying the numeric buffers. ``check_header``
and ``envelope_rows`` turn a whole Envelope into the rows the store keeps (the
collector, and importers writing a data dir directly, both use them), raising
``CodecError`` naming the envelope's seq. ``REJECTED_SEQ_KEY`` is the trailing
metadata key in which the collector names an envelope it refused.

Bounded decoding. An envelope's size on the wire says little about what it decodes to: a string
column's codes are 4 bytes a row whatever entry they point at, so 20,000 codes into one 10 KB
dictionary entry would decode to 200 MB (and past 2 GiB, Arrow's take overflows). Before anything
is allocated, ``decode_batch`` bounds what a batch will take: the fixed-width part (rows x the
table's row width, columns not sent included, as they are stored as nulls) and each string
column's bytes (its longest dictionary entry x rows; only when that bound is over the budget are
the codes looked at, as one numpy take over the entries' lengths). Over ``MAX_COLUMN_BYTES`` for
a string column or ``MAX_DECODED_BYTES`` for the envelope, or one string over
``MAX_STRING_BYTES``, the batch is refused naming the column. Hello's strings are capped too
(``HELLO_LIMITS``): they end up in every /metrics label and every runs query.
"""

from __future__ import annotations

import functools
import sys
import time
from array import array
from collections.abc import Mapping, Sequence
from itertools import accumulate

import numpy as np
import pyarrow as pa
import pyarrow.compute

from collector.data import layout
from collector.data.schema import (
    ARROW_TYPES,
    BOOL,
    F64,
    I64,
    RANK_ENDS_SCHEMA,
    RANKS_SCHEMA,
    RUNS_SCHEMA,
    STR,
    TABLES,
    timestamp,
)
from proto import SCHEMA_VERSION, pb

MAX_BATCH_ROWS = 1_000_000
# What one envelope may decode to. A legitimate batch decodes to about its size on the wire plus
# its rank column and the nulls of columns it left out: a client's 8,192-row comm batch to ~1 MB,
# an importer's 50,000-row one to ~6 MB (a comm row is 113 bytes fixed-width, so 64 MiB is ~590k
# rows; such a batch is ~60 MB on the wire, at the collector's message limit anyway).
MAX_DECODED_BYTES = 64 << 20
MAX_COLUMN_BYTES = 32 << 20  # the string bytes of one column of one batch
MAX_STRING_BYTES = 1 << 20  # one value of a batch's string column (a deep stack is ~100 KB)
# Hello's strings, in characters (run_id has its own rule, layout.check_run_id)
HELLO_LIMITS = {"run_name": 1024, "host": 255, "source": 64, "config_json": 1 << 20}
INT64_MAX = 2**63 - 1
MAX_WORLD_SIZE = 1 << 20
_NP_DTYPES = {I64: np.dtype("<i8"), F64: np.dtype("<f8"), BOOL: np.dtype("u1")}


REJECTED_SEQ_KEY = "rankscope-rejected-seq"
# Call metadata marking a stream of spool files left by exited processes (collector.rank.resend):
# the collector counts and reports what such streams bring, or refuses them (collect --no-resends).
RESEND_KEY = "rankscope-resend"
MAX_CLIENT_ID_CHARS = 256
RUN_END_STATUSES = ("finished", "failed", "stopped")  # stopped: ended by its user (Ctrl-C, a stop signal)
RUN_END_SENDERS = ("rank", "supervisor")  # RunEnd.ended_by; empty (an older sender) is the rank

Rows = tuple[str, str, pa.Table]  # (table, run_id, rows)


class CodecError(ValueError):
    """A batch that does not match the schema; the message says what and where."""


class SchemaVersionError(CodecError):
    """An envelope of a schema version this side does not speak."""


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


def _string_bytes(where: str, lengths: list[int], codes: bytes) -> int:
    """The bytes a string column decodes to: the lengths of the entries its codes point at, summed."""
    picks = np.frombuffer(codes, dtype="<u4")
    if picks.size and int(picks.max()) >= len(lengths):
        raise CodecError(f"{where}: string code out of range (dictionary has {len(lengths)} entries)")
    return int(np.take(np.asarray(lengths, dtype=np.int64), picks).sum())


def _decode_column(
    table: str, col: pb.Column, kind: str, rows: int, budget: list[int], wire: dict | None = None
) -> pa.Array:
    """One column as Arrow; ``wire``, if given, also gets the column's bytes as the wire had them."""
    where = f"{table}.{col.name}"
    present = col.WhichOneof("values")
    if present != kind:
        raise CodecError(f"{where}: expected type {kind}, got {present or 'no values'}")
    if kind == STR:
        codes = col.str.codes
        if len(codes) != rows * 4:
            raise CodecError(f"{where}: {len(codes)} code bytes, expected {rows * 4} ({rows} rows x 4)")
        dictionary = col.str.dictionary
        encoded = [v.encode() for v in dictionary]  # protobuf strings are valid UTF-8
        lengths = list(map(len, encoded))
        longest = max(lengths, default=0)
        if longest > MAX_STRING_BYTES:
            entry = lengths.index(longest)
            raise CodecError(
                f"{where}: dictionary entry {entry} is {longest} bytes; the limit is {MAX_STRING_BYTES} per value"
            )
        size = longest * rows  # a bound, exact enough for every ordinary batch
        if size > min(MAX_COLUMN_BYTES, budget[0]):
            size = _string_bytes(where, lengths, codes)
            if size > MAX_COLUMN_BYTES:
                raise CodecError(
                    f"{where}: {rows} rows decode to {size} string bytes; the limit is {MAX_COLUMN_BYTES} per column"
                )
            if size > budget[0]:
                raise CodecError(
                    f"{where}: {rows} rows decode to {size} string bytes, over what is left of the "
                    f"envelope's {MAX_DECODED_BYTES} decoded bytes ({budget[0]})"
                )
        budget[0] -= size
        try:  # take checks every code against the dictionary
            return _TAKE.call([_strings(encoded, lengths), _wrap(_CODES, rows, codes)])
        except IndexError:
            raise CodecError(f"{where}: string code out of range (dictionary has {len(dictionary)} entries)") from None
    data = getattr(col, kind)
    width = _NP_DTYPES[kind].itemsize
    if len(data) != rows * width:
        raise CodecError(f"{where}: {len(data)} bytes, expected {rows * width} ({rows} rows x {width})")
    if wire is not None:
        wire[col.name] = data  # the same bytes the array wraps: no copy
    if kind == BOOL:
        data = np.packbits(np.frombuffer(data, dtype="u1").astype(bool), bitorder="little")
    return _wrap(ARROW_TYPES[kind], rows, data)


# Arrays are wrapped around the wire's buffers (their sizes checked above) rather than built
# with pa.array or checked with numpy: those calls' overhead, ~10-20 us each, was most of the
# cost of decoding a small batch (100 records: 475 -> 214 us, `python -m benches.decode`).
_CODES = pa.uint32()
_TAKE = pa.compute.get_function("array_take")
_LITTLE_ENDIAN = sys.byteorder == "little"  # as the wire is


def _wrap(arrow_type: pa.DataType, rows: int, data) -> pa.Array:
    if not _LITTLE_ENDIAN and arrow_type.bit_width > 8:  # the wire is little-endian
        native = np.dtype(arrow_type.to_pandas_dtype())
        data = np.frombuffer(data, dtype=native.newbyteorder("<")).astype(native).tobytes()
    return pa.Array.from_buffers(arrow_type, rows, [None, pa.py_buffer(data)])


def _strings(encoded: list[bytes], lengths: list[int]) -> pa.Array:
    offsets = array("i", accumulate(lengths, initial=0))
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    )


# Values no clock or counter can produce, refused by column and row rather than stored silently:
# negative times and durations, a collective ending before it started, a bandwidth that is not a
# number (collector.data.bandwidth gives 0 for a zero duration). NaN or inf stay legal where a
# run may really produce them (a diverged loss in monitor.value).
NON_NEGATIVE = ("start_ns", "end_ns", "time_ns", "dur_ns", "entered_ns")
ORDERED = (("start_ns", "end_ns"),)
FINITE = ("algbw_gbs", "busbw_gbs")


@functools.cache
def _plausibility(table: str) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...], tuple[str, ...]]:
    """(columns that must be >= 0, (start, end) pairs, columns that must be finite) of ``table``;
    an end checked against its start is not checked on its own (end >= start >= 0)."""
    kinds = TABLES[table].column_types
    ordered = tuple((a, b) for a, b in ORDERED if kinds.get(a) == kinds.get(b) == I64)
    return (
        tuple(c for c in NON_NEGATIVE if kinds.get(c) == I64),
        ordered,
        tuple(c for c in FINITE if kinds.get(c) == F64),
    )


@functools.cache
def _checked(table: str) -> frozenset[str]:
    non_negative, _, finite = _plausibility(table)
    return frozenset((*non_negative, *finite))


def _check_plausible(table: str, sent: dict[str, bytes]) -> None:
    """``sent``: the wire's bytes of the batch's columns that ``_plausibility`` names (the buffers
    the decoded arrays wrap: viewed here, not copied). One reduction per column that must not be
    negative, per (start, end) pair and per finite column, each without a temporary as large as the
    column (a 16k-row column is 128 KB: malloc maps and unmaps such blocks, page faults each time);
    ~5 us a comm batch of up to a few thousand rows. The bad row is searched only once something is
    wrong."""
    non_negative, ordered, finite = _plausibility(table)
    ints = {name: np.frombuffer(sent[name], dtype="<i8") for name in non_negative if name in sent}
    paired = set()
    for a, b in ordered:
        if a in ints and b in ints:
            paired.add(b)  # end >= start >= 0
            if _ANY(np.less(ints[b], ints[a])):
                _refuse_implausible(table, sent)
    for name, values in ints.items():
        if name not in paired and _MIN(values) < 0:
            _refuse_implausible(table, sent)
    for name in finite:
        if name in sent and not _ALL(np.isfinite(np.frombuffer(sent[name], dtype="<f8"))):
            _refuse_implausible(table, sent)


_MIN, _ANY, _ALL = np.minimum.reduce, np.logical_or.reduce, np.logical_and.reduce  # ~1 us less than ndarray.min


def _refuse_implausible(table: str, sent: dict[str, bytes]) -> None:
    """The first implausible value of ``sent``, as a CodecError naming its column and row."""
    non_negative, ordered, finite = _plausibility(table)
    for name in non_negative:
        if name in sent:
            values = np.frombuffer(sent[name], dtype="<i8")
            if (values < 0).any():
                row = int(np.argmax(values < 0))
                raise CodecError(f"{table}.{name}: row {row} is {values[row]}; a time or duration cannot be negative")
    for a, b in ordered:
        if a in sent and b in sent:
            start, end = np.frombuffer(sent[a], dtype="<i8"), np.frombuffer(sent[b], dtype="<i8")
            if (end < start).any():
                row = int(np.argmax(end < start))
                raise CodecError(f"{table}.{b}: row {row} ends at {end[row]}, before its {a} {start[row]}")
    for name in finite:
        if name in sent:
            values = np.frombuffer(sent[name], dtype="<f8")
            bad = ~np.isfinite(values)
            if bad.any():
                row = int(np.argmax(bad))
                raise CodecError(f"{table}.{name}: row {row} is {values[row]}; expected a finite number")


_ROW_WIDTH = {I64: 8, F64: 8, BOOL: 1, STR: 4}  # bytes a row of a column takes decoded (strings: the offset)


@functools.cache
def _row_bytes(table: str) -> int:
    """A decoded row's fixed-width bytes: the rank column and every column of the table."""
    return 8 + sum(_ROW_WIDTH[kind] for _, kind in TABLES[table].columns)


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
        raise CodecError(f"table.rows: {rows} rows in one batch; the limit is {MAX_BATCH_ROWS}")
    types = spec.column_types
    fixed = rows * _row_bytes(batch.table)
    if fixed > MAX_DECODED_BYTES:
        raise CodecError(
            f"table.rows: {rows} rows of {batch.table} decode to {fixed} bytes before any string; "
            f"the limit is {MAX_DECODED_BYTES} per envelope"
        )
    budget = [MAX_DECODED_BYTES - fixed]  # what the string columns may still take
    checked = _checked(batch.table)
    arrays: dict[str, pa.Array] = {}
    plausible: dict[str, bytes] = {}  # the wire's bytes of the columns _check_plausible reads
    for col in batch.columns:
        name = col.name
        if name not in types:
            raise CodecError(f"{batch.table}: unknown column {name!r}")
        if name in arrays:
            raise CodecError(f"{batch.table}: column {name!r} sent twice")
        arrays[name] = _decode_column(
            batch.table, col, types[name], rows, budget, plausible if name in checked else None
        )
    if rows and not arrays:
        # Missing columns are stored as nulls (older clients), but a batch of nothing but a row
        # count would store all-NULL rows: 31 bytes on the wire declaring a million of them.
        raise CodecError(f"{batch.table}: table.rows declares {rows} rows but the batch carries no column")
    if rows and plausible:
        _check_plausible(batch.table, plausible)
    data = [_wrap(ARROW_TYPES[I64], rows, np.full(rows, batch.rank, dtype=np.int64))]
    for name, kind in spec.columns:
        # Columns a client did not send (an older client) are stored as nulls.
        data.append(arrays[name] if name in arrays else pa.nulls(rows, ARROW_TYPES[kind]))
    return pa.Table.from_arrays(data, schema=spec.arrow_schema())


def _timestamp(ns: int) -> pa.Array:
    return timestamp(ns or time.time_ns())


def _one_row(schema: pa.Schema, **values) -> pa.Table:
    return pa.table(
        {
            name: pa.array([values[name]], schema.field(name).type)
            if not isinstance(values[name], pa.Array)
            else values[name]
            for name in schema.names
        },
        schema=schema,
    )


def _check_range(field: str, value: int, low: int, high: int) -> None:
    """Protobuf integers are wider than what is stored (uint64 -> int64) or than makes sense."""
    if not low <= value <= high:
        raise CodecError(f"{field} = {value} is out of range [{low}, {high}]")


def envelope_rows(env: pb.Envelope) -> list[Rows]:
    """Validate one envelope's body and turn it into (table, run_id, rows) for the store.
    Raises CodecError naming the envelope's seq and the problem."""
    seq, body = env.seq, env.WhichOneof("body")
    try:
        if body == "table":
            batch = env.table
            rows = decode_batch(batch)
            return [(batch.table, batch.run_id, rows)] if rows.num_rows else []
        if body == "hello":
            h = env.hello
            check_run_id(h.run_id)
            for field, limit in HELLO_LIMITS.items():
                if len(value := getattr(h, field)) > limit:
                    raise CodecError(f"hello.{field} is {len(value)} characters; the limit is {limit}")
            if h.linked_run_id:
                try:
                    check_run_id(h.linked_run_id)
                except CodecError as exc:
                    raise CodecError(f"hello.linked_run_id: {exc}") from None
            _check_range("hello.world_size", h.world_size, 1, MAX_WORLD_SIZE)
            _check_range("hello.pid", h.pid, 0, INT64_MAX)
            _check_range("hello.started_at_ns", h.started_at_ns, 0, INT64_MAX)
            if h.world_size < 1 or not 0 <= h.rank < h.world_size:
                raise CodecError(f"hello: rank {h.rank} is not in [0, world_size={h.world_size})")
            started = _timestamp(h.started_at_ns)
            run = _one_row(
                RUNS_SCHEMA,
                run_id=h.run_id,
                name=h.run_name or h.run_id,
                world_size=h.world_size,
                started_at=started,
                source=h.source or None,
                linked_run_id=h.linked_run_id or None,
                config=h.config_json or None,
            )
            rank = _one_row(
                RANKS_SCHEMA,
                run_id=h.run_id,
                rank=h.rank,
                host=h.host or None,
                pid=h.pid,
                clock_offset_ns=h.clock_offset_ns,
                client_id=env.client_id,
                started_at=started,
            )
            return [("runs", h.run_id, run), ("ranks", h.run_id, rank)]
        if body == "end":
            e = env.end
            check_run_id(e.run_id)
            if e.rank < 0:
                raise CodecError(f"run end: rank {e.rank} is negative")
            _check_range("end.dropped_records", e.dropped_records, 0, INT64_MAX)
            _check_range("end.ended_at_ns", e.ended_at_ns, 0, INT64_MAX)
            if e.status not in RUN_END_STATUSES:
                raise CodecError(f"run end: status {e.status!r} is not one of {', '.join(RUN_END_STATUSES)}")
            ended_by = e.ended_by or "rank"
            if ended_by not in RUN_END_SENDERS:
                raise CodecError(f"run end: ended_by {e.ended_by!r} is not one of {', '.join(RUN_END_SENDERS)}")
            end = _one_row(
                RANK_ENDS_SCHEMA,
                run_id=e.run_id,
                rank=e.rank,
                status=e.status,
                ended_at=_timestamp(e.ended_at_ns),
                dropped_records=e.dropped_records,
                ended_by=ended_by,
            )
            return [("rank_ends", e.run_id, end)]
    except CodecError as exc:
        raise CodecError(f"envelope seq {seq}: {exc}") from None
    raise CodecError(f"envelope seq {seq}: no body (expected hello, table or end)")


def check_header(env: pb.Envelope) -> None:
    """The envelope's schema version, client id and seq; SchemaVersionError / CodecError."""
    seq = env.seq
    if env.schema_version != SCHEMA_VERSION:
        raise SchemaVersionError(
            f"envelope seq {seq}: schema_version {env.schema_version} is not supported; "
            f"this collector speaks schema_version {SCHEMA_VERSION}"
        )
    if not env.client_id or len(env.client_id) > MAX_CLIENT_ID_CHARS:
        raise CodecError(f"envelope seq {seq}: client_id must be 1-{MAX_CLIENT_ID_CHARS} characters")
    if seq == 0:
        raise CodecError("envelope seq 0: seq starts at 1")
    if seq > INT64_MAX:
        raise CodecError(f"envelope seq {seq}: envelope.seq is out of range [1, {INT64_MAX}]")
