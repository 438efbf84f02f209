"""The DuckDB catalog: views over the Parquet segments, and read-only access.

``D/catalog.duckdb`` holds views only, with paths relative to D, so a data dir
can be moved or copied (``sample_runs/`` is one). ``connect(D)`` opens it
read-only with ``file_search_path`` set to D, which is what DuckDB resolves the
relative ``read_parquet`` paths against, whatever the process's cwd.

The catalog file is never held open by a writer: ``ensure_catalog`` builds a
fresh file under a temporary name and renames it over the old one, so readers
in other processes (dashboard, ``rankscope sql``) are never locked out; a
reader that already had the old file open keeps reading the same Parquet.

Readers see snapshots (collector.data.snapshots: ``pin``): every view of one query sees one
commit of the collector's. The views themselves are collector.data.views; the guard for
user-typed SQL is collector.data.sql_guard. Their public names are importable from here too.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from pathlib import Path

import duckdb

from collector.data import layout
from collector.data.snapshots import (
    UnreadableSegmentWarning,
    damaged_segment,
    partition_path_of,
    pin,
    readable_segments,
    segment_problem,
    snapshot_files,
    with_segment_retry,
)
from collector.data.sql_guard import (
    QUERY_TIMEOUT_S,
    SQL_MEMORY_LIMIT,
    SQL_MEMORY_LIMIT_ENV,
    SQL_TIME_LIMIT_ENV,
    QueryError,
    SqlLimits,
    format_byte_size,
    parse_byte_size,
    readonly_connection,
    run_readonly_query,
)
from collector.data.views import (
    SEGMENTS_VARIABLE,
    create_views,
    desyncs_sql,
    liveness_views,
    quote_ident,
    quote_literal,
    view_definitions,
)

__all__ = [
    "QUERY_TIMEOUT_S",
    "SEGMENTS_VARIABLE",
    "SQL_MEMORY_LIMIT",
    "SQL_MEMORY_LIMIT_ENV",
    "SQL_TIME_LIMIT_ENV",
    "VERSION_VIEW",
    "QueryError",
    "SqlLimits",
    "UnreadableSegmentWarning",
    "connect",
    "cursor",
    "damaged_segment",
    "desyncs_sql",
    "ensure_catalog",
    "format_byte_size",
    "liveness_views",
    "parse_byte_size",
    "partition_path_of",
    "pin",
    "quote_ident",
    "quote_literal",
    "readable_segments",
    "readonly_connection",
    "run_readonly_query",
    "segment_problem",
    "snapshot_files",
    "view_definitions",
    "with_segment_retry",
]

VERSION_VIEW = "rankscope_catalog_version"


@functools.cache
def _catalog_version() -> str:
    """What this code builds: the views and the placeholders' schemas (a catalog of this version had its
    placeholders written by this code, so a reader need not read them again)."""
    text = "\n".join(f"{k}={v}" for k, v in view_definitions().items())
    text += "\n" + "\n".join(f"{name}={schema}" for name, schema in layout.stored_schemas().items())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _version_of(con: duckdb.DuckDBPyConnection) -> str | None:
    try:
        return con.execute(f"SELECT version FROM {quote_ident(VERSION_VIEW)}").fetchone()[0]
    except duckdb.Error:
        return None


def _installed_version(path: Path) -> str | None:
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return None
    try:
        return _version_of(con)
    finally:
        con.close()


def _open_current(root: Path) -> duckdb.DuckDBPyConnection | None:
    """D's catalog opened read-only, where this code built it and its placeholders are in place; None
    where it must be built first. One open, not two: a `rankscope health` poll opens a catalog each time."""
    path = root / layout.CATALOG_FILE
    if not path.exists() or not layout.placeholders_present(root):
        return None
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return None
    if _version_of(con) == _catalog_version():
        return con
    con.close()
    return None


def ensure_catalog(data_dir) -> Path:
    """Create or refresh D/catalog.duckdb (and the schema placeholders); returns its path."""
    root = Path(data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    layout.ensure_placeholders(root)
    path = root / layout.CATALOG_FILE
    version = _catalog_version()
    if path.exists() and _installed_version(path) == version:
        return path
    tmp = root / f".{layout.CATALOG_FILE}.{os.getpid()}.{time.monotonic_ns()}{layout.TEMP_SUFFIX}"
    con = duckdb.connect(str(tmp))
    try:
        con.execute("SET file_search_path = ?", [str(root)])
        create_views(con, view_definitions(), temporary=False)
        con.execute(f"CREATE VIEW {quote_ident(VERSION_VIEW)} AS SELECT {quote_literal(version)} AS version")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    os.replace(tmp, path)
    return path


def stopped_by_signal(exc: BaseException) -> bool:
    """Whether a query's error is a signal's stop: Ctrl-C (a handler that raised) landing inside a
    DuckDB query comes out as RuntimeError('Query interrupted'), not KeyboardInterrupt, so a poll
    that retries on errors must ask; a query stopped by ``interrupt()`` (the SQL time limit) is a
    duckdb.InterruptException instead."""
    return type(exc) is RuntimeError and str(exc) == "Query interrupted"


def connect(data_dir) -> duckdb.DuckDBPyConnection:
    """A read-only connection to D's catalog; every view works from any cwd. Its views read the
    snapshot of D as it is now (``pin``): use it for a while, not for ever, or ``pin`` it again."""
    root = layout.check_data_dir(Path(data_dir).resolve())  # creates nothing in a folder that is not one
    con = _open_current(root)
    if con is None:
        con = duckdb.connect(str(ensure_catalog(root)), read_only=True)
    con.execute("SET file_search_path = ?", [str(root)])
    pin(con, root)
    return con


def cursor(con: duckdb.DuckDBPyConnection, data_dir, skip: set[str] | frozenset[str] = frozenset()):
    """A cursor of ``con`` for another thread. Settings are per cursor, so it gets the
    catalog's relative-path root again, and the snapshot of D as it is now (``pin``)."""
    cur = con.cursor()
    cur.execute("SET file_search_path = ?", [str(Path(data_dir).resolve())])
    pin(cur, data_dir, skip)
    return cur
