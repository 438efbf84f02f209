"""The guard for user-typed SQL (``rankscope sql``, the dashboard console): one query statement,
run in a private in-memory database whose only readable data is D's segments, within limits on
its memory and time (``SqlLimits``)."""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from collector.data import layout
from collector.data.schema import TABLES, reading_schema
from collector.data.snapshots import partition_path_of, readable_segments, snapshot_files, with_segment_retry
from collector.data.views import create_views, guard_relation, view_definitions

# Statement types a user query may have; DESCRIBE/SHOW/SUMMARIZE/FROM parse as SELECT.
_QUERY_TYPES = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
QUERY_TIMEOUT_S = 30.0  # a user query running longer is interrupted (a runaway recursive CTE, a huge join)
SQL_MEMORY_LIMIT = 1 << 30  # what one user query may hold (DuckDB's own default is 80% of the machine's RAM)
SQL_MEMORY_LIMIT_ENV = "RANKSCOPE_SQL_MEMORY_LIMIT"
SQL_TIME_LIMIT_ENV = "RANKSCOPE_SQL_TIME_LIMIT"


class QueryError(Exception):
    """A user query that was refused or failed; the message is DuckDB's or ours."""


def _guard_dataset(
    root: Path, table: str, schema: pa.Schema, *, hive: bool, snapshot: dict[str, list[str]] | None
) -> ds.Dataset:
    files = readable_segments(root, table, snapshot)
    schema = reading_schema(schema)  # a data dir written before holds ns timestamps beside the new µs ones
    if not hive:
        return ds.dataset(files, schema=schema, format="parquet")
    run = pa.schema([("run", pa.string())])
    return ds.dataset(
        files,
        schema=pa.schema(list(schema) + list(run)),
        format="parquet",
        # D itself: segments are under parquet/<table>/ or snapshot/<table>/, and the hive
        # partitioning takes run=<id> from the folders below D, whatever D's own path holds
        partitioning=ds.partitioning(run, flavor="hive"),
        partition_base_dir=str(root),
    )


def readonly_connection(data_dir, memory_limit: int | None = None) -> duckdb.DuckDBPyConnection:
    """A private in-memory database with the catalog's views that can touch no file at all.

    The views read Arrow datasets over D/parquet that Python opened (read-only by
    construction) instead of DuckDB's own file access, so external access is off
    entirely: no COPY target, no ATTACH, no read outside the data, no extension;
    the configuration is locked so no statement, however wrapped, can turn any of it
    back on, memory_limit (``memory_limit`` bytes; None: DuckDB's default) included.
    Opening the connection writes nothing in D."""
    root = Path(data_dir).resolve()
    layout.check_data_dir(root, error=QueryError)
    con = duckdb.connect(":memory:", config={"temp_directory": ""})
    snapshot = snapshot_files(root)  # one read of the manifests: every table of this query from one commit
    for table, schema in layout.stored_schemas().items():
        hive = table in TABLES or table in layout.DERIVED_TABLES  # partitioned by run=<id>
        con.register(guard_relation(table), _guard_dataset(root, table, schema, hive=hive, snapshot=snapshot))
    create_views(con, view_definitions(root=None), temporary=False)
    if memory_limit is not None:
        con.execute("SET memory_limit = ?", [f"{memory_limit}B"])
    for setting, value in _GUARD_SETTINGS.items():
        con.execute(f"SET {setting} = ?", [value])
    return con


# Order matters: the allow lists can only be set while external access is on; the lock goes last.
_GUARD_SETTINGS = {
    "allowed_directories": [],
    "allowed_paths": [],
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "python_enable_replacements": False,
    "max_temp_directory_size": "0B",
    "enable_progress_bar": False,  # DuckDB draws it on stdout after 2 s: into `rankscope sql`'s output
    "lock_configuration": True,
}


# -- limits on user SQL ------------------------------------------------------------

_BYTE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_BYTE_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_NO_LIMIT = ("none", "off", "unlimited")


def parse_byte_size(text: str) -> int:
    """'1GiB', '512MB', '1.5 G', '4096' -> bytes. K/M/G/T are powers of 1024 with or without
    the 'i' (as DeepSpeed and the rest of rankscope print sizes)."""
    m = _BYTE_SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 512MiB, 2GiB)")
    return int(float(m.group(1)) * _BYTE_UNITS[m.group(2).upper()])


def format_byte_size(n: int) -> str:
    """1073741824 -> '1 GiB', 314572800 -> '300 MiB' (whole units where exact)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class SqlLimits:
    """What one user query may use: DuckDB's memory_limit (and the result it hands back) and
    wall time. None: no limit. ``resolve`` takes a flag's text, else the environment, else the default."""

    memory_bytes: int | None = SQL_MEMORY_LIMIT
    time_s: float | None = QUERY_TIMEOUT_S

    @classmethod
    def resolve(cls, memory: str | None = None, time_s: str | None = None) -> SqlLimits:
        """Raises ValueError naming the flag or variable whose value is bad."""
        memory_text = memory if memory is not None else os.environ.get(SQL_MEMORY_LIMIT_ENV) or None
        time_text = time_s if time_s is not None else os.environ.get(SQL_TIME_LIMIT_ENV) or None
        where_memory = "--sql-memory-limit" if memory is not None else SQL_MEMORY_LIMIT_ENV
        where_time = "--sql-time-limit" if time_s is not None else SQL_TIME_LIMIT_ENV
        return cls(
            memory_bytes=SQL_MEMORY_LIMIT if memory_text is None else _memory_limit(memory_text, where_memory),
            time_s=QUERY_TIMEOUT_S if time_text is None else _time_limit(time_text, where_time),
        )


def _memory_limit(text: str, where: str) -> int | None:
    if text.strip().lower() in _NO_LIMIT:
        return None
    try:
        value = parse_byte_size(text)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    if value < 1 << 20:
        raise ValueError(f"{where}: {text!r} is under 1 MiB; give a size such as 512MiB or 2GiB (or 'none')")
    return value


def _time_limit(text: str, where: str) -> float | None:
    if text.strip().lower() in _NO_LIMIT:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: not a number of seconds: {text!r} (e.g. 30, or 'none')") from None
    if not 0 < value < float("inf"):
        raise ValueError(f"{where}: {text!r} must be a positive number of seconds (or 'none')")
    return value


class _ResultTooLarge(Exception):
    pass


_UNSET = object()


def run_readonly_query(
    data_dir,
    sql: str,
    max_rows: int | None = 10_000,
    timeout_s: float | None = _UNSET,  # type: ignore[assignment]
    memory_limit: int | None = _UNSET,  # type: ignore[assignment]
) -> pa.Table:
    """Run one user query read-only and return (at most max_rows rows of) its result,
    interrupting it after ``timeout_s`` seconds and stopping it when it needs more than
    ``memory_limit`` bytes (DuckDB's operators, and the result handed back). Either left
    out: ``$RANKSCOPE_SQL_TIME_LIMIT`` / ``$RANKSCOPE_SQL_MEMORY_LIMIT``, else 30 s / 1 GiB;
    None: no limit.

    Raises QueryError with a message fit to show the user: DuckDB's own error
    text for bad SQL, or why the statement was refused or stopped (naming the limit hit)."""
    if timeout_s is _UNSET or memory_limit is _UNSET:
        try:
            limits = SqlLimits.resolve()
        except ValueError as exc:
            raise QueryError(str(exc)) from None
        timeout_s = limits.time_s if timeout_s is _UNSET else timeout_s
        memory_limit = limits.memory_bytes if memory_limit is _UNSET else memory_limit
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(str(exc)) from None
    if len(statements) != 1:
        raise QueryError(f"expected exactly one SQL statement, got {len(statements)}")
    statement = _explained(statements[0])
    if statement.type not in _QUERY_TYPES:
        raise QueryError(
            f"only queries are allowed here (SELECT, WITH, FROM, DESCRIBE, SHOW, "
            f"SUMMARIZE, EXPLAIN); this is a{_statement_name(statement)} statement"
        )
    # The check above is only the friendly message; what the connection is allowed to do is
    # the defence (EXPLAIN ANALYZE runs what it wraps, so it passes here and fails there).

    def attempt() -> pa.Table:
        # Creating the views lists the segments too, so it is retried with the query.
        con = readonly_connection(data_dir, memory_limit=memory_limit)
        # interrupt() is DuckDB's documented way to stop a running query from another thread.
        timer = threading.Timer(timeout_s, con.interrupt) if timeout_s is not None else None
        try:
            if timer is not None:
                timer.daemon = True
                timer.start()
            return _fetch(con, sql, max_rows, memory_limit)
        finally:
            if timer is not None:
                # joined, not only cancelled: the daemon timer thread holds ``con`` (its interrupt); one
                # still waking up when the CLI exits would keep the connection alive past interpreter
                # finalization, and DuckDB's bindings then print a "nanobind: leaked ..." dump
                timer.cancel()
                timer.join()
            con.close()

    narrow = "narrow it (WHERE run_id = ..., fewer columns, LIMIT) and run it again"
    try:
        return with_segment_retry(attempt)
    except duckdb.InterruptException:
        raise QueryError(
            f"query stopped after {timeout_s:g} s (the time limit: --sql-time-limit or ${SQL_TIME_LIMIT_ENV}); {narrow}"
        ) from None
    except (duckdb.OutOfMemoryException, _ResultTooLarge) as exc:
        what = "its result is larger than" if isinstance(exc, _ResultTooLarge) else "it needed more than"
        raise QueryError(
            f"query stopped: {what} the {format_byte_size(memory_limit or 0)} memory limit "
            f"(--sql-memory-limit or ${SQL_MEMORY_LIMIT_ENV}); {narrow}"
        ) from None
    except (duckdb.Error, OSError, pa.ArrowException) as exc:
        raise QueryError(_naming_bad_segments(data_dir, str(exc))) from None


_DATASET_ERROR_RE = re.compile(r"stream registered as '_segments_(\w+)'")


def _naming_bad_segments(data_dir, message: str) -> str:
    """An Arrow dataset's scan error does not say which file: find the segments of that table
    that do not read (only on this error path) and name them."""
    match = _DATASET_ERROR_RE.search(message)
    if not match:
        return message
    bad = []
    for path in readable_segments(data_dir, match.group(1)):
        try:
            pq.ParquetFile(path).read()
        except (OSError, pa.ArrowException) as exc:
            bad.append(f"{partition_path_of(data_dir, path)} ({str(exc).strip() or type(exc).__name__})")
    if not bad:
        return message
    return (
        f"unreadable segment(s): {'; '.join(bad)}. The collector moves such a segment to "
        f"{layout.QUARANTINE_DIR}/ at its next compaction pass; queries that do not read it still work."
    )


_EXPLAIN_RE = re.compile(r"^\s*EXPLAIN\s+(?:ANALY[SZ]E\s+)?(.*)$", re.IGNORECASE | re.DOTALL)
_COMMENT_RE = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


def _explained(statement):
    """The statement an EXPLAIN wraps (so the message names it), else ``statement`` itself.
    Best effort: when the inner text does not parse on its own, the EXPLAIN goes on to DuckDB."""
    if statement.type != duckdb.StatementType.EXPLAIN:
        return statement
    match = _EXPLAIN_RE.match(_COMMENT_RE.sub(" ", statement.query))
    try:
        inner = duckdb.extract_statements(match.group(1)) if match else []
    except duckdb.Error:
        return statement
    return _explained(inner[0]) if len(inner) == 1 else statement


def _statement_name(statement) -> str:
    """' COPY', ' INSTALL'...: DuckDB files INSTALL under LOAD; the user typed INSTALL."""
    name = statement.type.name
    if name == "LOAD" and statement.query.lstrip().upper().startswith("INSTALL"):
        name = "INSTALL"
    return f"{'n' if name[0] in 'AEIOU' else ''} {name}"


def _fetch(con: duckdb.DuckDBPyConnection, sql: str, max_rows: int | None, memory_limit: int | None = None) -> pa.Table:
    # DuckDB's memory_limit covers its operators, not the batches handed to Python: count those.
    # Small batches (one DuckDB vector) keep what is read past the limit to one vector.
    reader = con.sql(sql).to_arrow_reader(min(max_rows or 2048, 2048))
    batches, rows, nbytes = [], 0, 0
    for batch in reader:
        nbytes += batch.nbytes
        if memory_limit is not None and nbytes > memory_limit:
            raise _ResultTooLarge
        if max_rows is not None and rows + batch.num_rows >= max_rows:
            batches.append(batch.slice(0, max_rows - rows))
            break
        batches.append(batch)
        rows += batch.num_rows
    return pa.Table.from_batches(batches, schema=reader.schema)
