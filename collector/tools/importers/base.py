"""What every importer returns: rows for rankscope's tables, and the problems it met.

An importer reads one file in one of DeepSpeed's output formats and never
raises on bad content: a line, record or file it cannot parse becomes a
``Problem`` naming the file and the line (or record), and everything else in
the file is still imported.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow as pa

from collector.data.schema import I64, STR, TABLES


@dataclass(frozen=True)
class Problem:
    path: str
    where: str  # "line 12", "record 3 (byte 1040)", or "" for the whole file
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.where}: {self.message}" if self.where else f"{self.path}: {self.message}"


@dataclass
class Parsed:
    """Rows per (table, rank) in schema order, plus run-level hints."""

    rows: dict[tuple[str, int], list[dict]] = field(default_factory=lambda: defaultdict(list))
    problems: list[Problem] = field(default_factory=list)
    world_size: int | None = None  # when the file says (summary metadata, profiler header)
    sources: list[str] = field(default_factory=list)

    def add(self, table: str, rank: int, where: str = "", **row) -> bool:
        """Keep one row; a value the store cannot hold (an integer outside int64, a string
        over MAX_FIELD_CHARS) turns the row into a problem at ``where`` instead. Returns
        whether it was kept."""
        problem = _out_of_bounds(table, rank, row)
        if problem:
            self.problem(self.sources[0] if self.sources else "?", where, f"{problem}; row skipped")
            return False
        self.rows[(table, rank)].append(row)
        return True

    def problem(self, path, where: str, message: str) -> None:
        self.problems.append(Problem(str(path), where, message))

    def unreadable(self, path, exc: OSError) -> Parsed:
        """Record that ``path`` could not be read at all; returns self, the (empty) result."""
        self.problem(path, "", f"cannot read: {exc.strerror}")
        return self

    def merge(self, other: Parsed) -> None:
        for key, rows in other.rows.items():
            self.rows[key].extend(rows)
        self.problems.extend(other.problems)
        self.sources.extend(other.sources)
        if other.world_size:
            self.world_size = max(self.world_size or 0, other.world_size)

    @property
    def ranks(self) -> set[int]:
        return {rank for _, rank in self.rows}

    def row_count(self, table: str | None = None) -> int:
        return sum(len(r) for (t, _), r in self.rows.items() if table in (None, t))

    def arrow(self, table: str, rank: int) -> pa.Table:
        """The rows of (table, rank) as a table with the stored schema."""
        schema = TABLES[table].arrow_schema()
        rows = self.rows.get((table, rank), [])
        columns = {"rank": [rank] * len(rows)}
        for name in schema.names[1:]:
            columns[name] = [r.get(name) for r in rows]
        return pa.table(columns, schema=schema)


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_FIELD_CHARS = 64 << 10  # a tag, module or group name longer than this is no DeepSpeed output


def _out_of_bounds(table: str, rank: int, row: dict) -> str | None:
    """Why ``row`` cannot be stored in ``table``, or None when it can."""
    if not 0 <= rank <= INT64_MAX:
        return f"rank {rank} is out of range"
    types = TABLES[table].column_types
    for name, value in row.items():
        kind = types.get(name)
        if kind == I64 and isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            return f"{name} = {value} does not fit in a 64-bit integer"
        if kind == STR and isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
            return f"{name} is {len(value)} characters long; the limit is {MAX_FIELD_CHARS}"
    return None


# -- units as DeepSpeed prints them ------------------------------------------------

_SIZE_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "PB": 1 << 50}
_METRIC = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3, "u": 1e-6}
_SIZE_RE = re.compile(r"^\s*([0-9.]+)\s*([KMGTP]?B)\s*$")


def parse_size(text: str) -> int:
    """'678.86 MB' -> bytes (DeepSpeed's convert_size: powers of 1024, 2 decimals, so
    a size read back is within 0.5% of the original). '0B' -> 0."""
    if text.strip() == "0B":
        return 0
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"not a message size: {text!r}")
    return round(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def parse_metric(text: str, unit: str = "") -> float:
    """'1.35 K' -> 1350.0, '5.12 KMACs' (unit 'MACs') -> 5120.0, '98.71 us' (unit 's') ->
    9.871e-05: the flops profiler's number_to_string, powers of 1000."""
    m = re.match(rf"^\s*([0-9.eE+-]+)\s*([KMGTmu]?){re.escape(unit)}\s*$", text)
    if not m:
        raise ValueError(f"not a number{' of ' + unit if unit else ''}: {text!r}")
    return float(m.group(1)) * _METRIC[m.group(2)]
