"""Opening a data dir's catalog for queries (``Catalog``: per-query cursors pinned to one snapshot,
unreadable segments left out), and the small in-memory engine the rollup pages run on."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa

from collector.data import catalog, layout


class DataDirError(Exception):
    """The data dir is missing or its catalog cannot be opened."""


MAX_SKIPPED_PER_QUERY = 8


class Catalog:
    """One data dir's catalog, shared by threads: each query runs on its own cursor
    (DuckDB connections are not shared across threads), pinned to the snapshot of D
    as the query starts (``catalog.pin``: every view of it sees one commit), and run
    again on the next snapshot if a file of its snapshot was deleted under it (a query
    slower than the collector's ``delete_after_s``)."""

    def __init__(self, data_dir) -> None:
        self.data_dir = str(data_dir)
        self.skipped: set[str] = set()  # segments found unreadable, left out of every later query
        try:
            self.con = catalog.connect(self.data_dir)
            # Segments never change once renamed into place, so their footers can be cached.
            self.con.execute("SET parquet_metadata_cache = true")
        except (OSError, duckdb.Error) as exc:
            raise DataDirError(f"cannot open the catalog in {self.data_dir!r}: {exc}") from None

    def cursor(self) -> duckdb.DuckDBPyConnection:
        cur = catalog.cursor(self.con, self.data_dir, self.skipped)
        cur.execute("SET enable_progress_bar = false")  # it would print into a server's log
        return cur

    def has_rows(self, table: str, run_id: str) -> bool:
        """Whether ``run_id`` has a committed segment of ``table`` (one directory listing): a query of a
        table the run never wrote can be skipped."""
        part = layout.partition_dir(Path(self.data_dir), table, run_id)
        return part.is_dir() and any(part.glob(f"*{layout.SEGMENT_SUFFIX}"))

    def df(self, sql: str, params: list) -> pd.DataFrame:
        return self._run(lambda cur: cur.execute(sql, params).df())

    def arrow(self, sql: str, params: list) -> pa.Table:
        return self._run(lambda cur: cur.sql(sql, params=params).to_arrow_table())

    def _run(self, fetch):
        """``fetch(cursor)``; a segment that turns out unreadable is left out from then on, with a
        warning naming it (the collector quarantines it), instead of failing every query."""
        for _ in range(MAX_SKIPPED_PER_QUERY):
            try:  # each attempt on a fresh cursor: a retry takes the snapshot of D as it is then
                return catalog.with_segment_retry(lambda: self._once(fetch))
            except duckdb.Error as exc:
                bad = catalog.damaged_segment(self.data_dir, str(exc))
                if bad is None or bad in self.skipped:
                    raise
                warnings.warn(
                    f"skipping unreadable segment {bad}: {exc}", catalog.UnreadableSegmentWarning, stacklevel=3
                )
                self.skipped.add(bad)
        raise DataDirError(f"too many unreadable segments in {self.data_dir!r}: {', '.join(sorted(self.skipped))}")

    def _once(self, fetch):
        cur = self.cursor()
        try:
            return fetch(cur)
        finally:
            cur.close()

    def close(self) -> None:
        self.con.close()


# Rollups are small: one thread per query answers faster on a busy machine than many.
_engine = duckdb.connect(":memory:", config={"threads": 1})
_engine_lock = threading.Lock()


def in_memory(sql: str, params: list, **tables: pa.Table) -> pd.DataFrame:
    """Run SQL over in-memory Arrow ``tables``, each readable under its keyword's name."""
    with _engine_lock:
        cur = _engine.cursor()
    try:
        for name, table in tables.items():
            cur.register(name, table)
        return cur.execute(sql, params).df()
    finally:
        cur.close()


def on_rollup(rollup: pa.Table, sql: str, params: list) -> pd.DataFrame:
    """Run SQL that reads the Arrow rollup as the relation ``r``."""
    return in_memory(sql, params, r=rollup)
