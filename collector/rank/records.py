"""Records waiting to be shipped: one bounded buffer shared by every table.

Any thread adds (``emit`` rows from the engine, profiler and monitor; column
chunks from the comm drain thread); the client thread takes everything every
flush. Adding is a dict check and a deque append under a lock, never I/O. When
``max_rows`` are waiting the new records are counted as dropped instead: the
count is logged and reported in RunEnd.dropped_records.
"""

from __future__ import annotations

import collections
import logging
import threading

from collector.data.schema import TABLES

log = logging.getLogger("rankscope.records")


class RecordBuffer:
    def __init__(self, max_rows: int = 1_000_000) -> None:
        self.max_rows = max_rows
        self._chunks: collections.deque = collections.deque()  # (table, columns: dict[str, list], rows)
        self._rows = 0
        self._lock = threading.Lock()
        self.dropped = 0
        self._warned: set[str] = set()

    def __len__(self) -> int:
        return self._rows

    def _admit(self, n: int) -> bool:
        if self._rows + n > self.max_rows:
            if not self.dropped:
                log.warning(
                    "rankscope: record buffer full (%d rows); dropping records until the collector catches up",
                    self.max_rows,
                )
            self.dropped += n
            return False
        self._rows += n
        return True

    def _unknown(self, table: str, row: dict) -> str | None:
        spec = TABLES.get(table)
        if spec is None:
            return f"unknown table {table!r}; known: {', '.join(TABLES)}"
        bad = [k for k in row if k not in spec.column_types]
        if bad:
            return f"{table}.{bad[0]} is not a column; columns: {', '.join(spec.column_types)}"
        return None

    def add_row(self, table: str, row: dict, step: int) -> bool:
        problem = self._unknown(table, row)
        if problem:
            self._warn_once(problem)
            return False
        if "step" not in row:
            row["step"] = step
        with self._lock:
            if not self._admit(1):
                return False
            self._chunks.append((table, row, 0))
        return True

    def add_columns(self, table: str, columns: dict[str, list], rows: int) -> bool:
        problem = self._unknown(table, columns)
        if problem:
            self._warn_once(problem)
            return False
        with self._lock:
            if not self._admit(rows):
                return False
            self._chunks.append((table, columns, rows))
        return True

    def take(self) -> list[tuple[str, dict[str, list], int]]:
        """Everything waiting, as (table, columns, rows) chunks. Single rows are
        merged per table and key set, so a row that leaves a column out gets a
        null there (the column is absent from its batch), never a made-up value."""
        with self._lock:
            chunks, self._chunks = self._chunks, collections.deque()
            self._rows = 0
        out: list[tuple[str, dict[str, list], int]] = []
        merged: dict[tuple, dict[str, list]] = {}
        for table, payload, rows in chunks:
            if rows:
                out.append((table, payload, rows))
                continue
            key = (table, tuple(payload))
            cols = merged.get(key)
            if cols is None:
                cols = merged[key] = {k: [] for k in payload}
            for k, v in payload.items():
                cols[k].append(v)
        for (table, keys), cols in merged.items():
            out.append((table, cols, len(cols[keys[0]])))
        return out

    def _warn_once(self, problem: str) -> None:
        if problem not in self._warned:
            self._warned.add(problem)
            log.warning("rankscope: record dropped: %s", problem)
