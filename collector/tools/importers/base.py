"""What every importer returns: rows for rankscope's tables, and the problems it met.

An importer reads one file in one of DeepSpeed's output formats and never
raises on bad content: a line, record or file it cannot parse becomes a
``Problem`` naming the file and the line (or record), and everything else in
the file is still imported.

What one file may cost is bounded, so a hostile or broken file costs only itself
(reported by name, with the field that broke the bound, and skipped whole): its size
(``MAX_FILE_BYTES``, or a format's own ``MAX_BYTES``: JSON 64 MiB), JSON nesting
(``MAX_JSON_DEPTH``, measured before the parser recurses), the rows it becomes
(``MAX_FILE_ROWS``) and the rows it may claim without writing them out (a summary's
counts, ``MAX_CLAIMED_ROWS``).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from collector.data import bandwidth
from collector.data.codec import MAX_WORLD_SIZE
from collector.data.schema import I64, STR, TABLES, group_name, rank_ranges


@dataclass(frozen=True)
class Problem:
    path: str
    where: str  # "line 12", "record 3 (byte 1040)", or "" for the whole file
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.where}: {self.message}" if self.where else f"{self.path}: {self.message}"


MAX_FILE_BYTES = 2 << 30  # any format; tensorboard and Parquet files are read whole
MAX_FILE_ROWS = 10_000_000  # rows one file may become (each a Python dict until it is sent)
MAX_CLAIMED_ROWS = 1_000_000  # rows a file may claim by a count (a log_summary entry's "count")
MAX_JSON_BYTES = 64 << 20  # a log_summary is kilobytes
MAX_JSON_DEPTH = 64  # a log_summary is 4 levels deep; Python's parser recurses once a level
MAX_PROBLEMS = 100  # listed per file; a file of a million bad lines is one file's worth of report


class FileTooCostly(ValueError):
    """A file over one of the bounds above; the message names the bound (and the file's figure)."""


def size_text(n: int) -> str:
    """4096 -> '4 KiB', 67108864 -> '64 MiB' (powers of 1024, as DeepSpeed prints sizes)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def check_size(path: Path, limit: int) -> None:
    """Raises FileTooCostly when ``path`` is over ``limit`` bytes."""
    size = path.stat().st_size
    if size > limit:
        raise FileTooCostly(f"{size_text(size)}, larger than the {size_text(limit)} an import reads of such a file")


_CHUNK = 1 << 20
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def json_depth(data: bytes) -> int:
    """How deeply ``data``'s arrays and objects nest, brackets inside strings left out, without
    parsing it (so without recursing): the running count of opening minus closing brackets, at
    its highest. Vectorised over 1 MiB slices, so any input costs a few MiB and linear time."""
    depth = deepest = 0
    in_string = False
    backslashes = 0  # the run of backslashes the previous slice ended with
    for at in range(0, len(data), _CHUNK):
        b = np.frombuffer(data, dtype=np.uint8, count=min(_CHUNK, len(data) - at), offset=at)
        idx = np.arange(b.size, dtype=np.int64)
        is_bs = b == _BACKSLASH
        # index of the last non-backslash at or before each position (the carried run sits before 0)
        last_plain = np.maximum.accumulate(np.where(is_bs, -1 - backslashes, idx))
        run_before = np.empty(b.size, dtype=np.int64)  # backslashes right before each position
        run_before[0] = backslashes
        run_before[1:] = idx[:-1] - last_plain[:-1]
        quotes = (b == _QUOTE) & (run_before % 2 == 0)  # an escaped quote ends no string
        inside = (np.cumsum(quotes) + in_string) % 2 == 1  # at a quote: the state after it
        opening = ((b == ord("[")) | (b == ord("{"))) & ~inside
        closing = ((b == ord("]")) | (b == ord("}"))) & ~inside
        if opening.any() or closing.any():
            running = depth + np.cumsum(opening.astype(np.int64) - closing)
            deepest, depth = max(deepest, int(running.max())), int(running[-1])
        in_string = bool(inside[-1])
        backslashes = int(b.size - 1 - last_plain[-1]) if is_bs[-1] else 0
    return deepest


def load_json(path: Path, max_bytes: int = MAX_JSON_BYTES):
    """``path``'s JSON document, within the size and depth bounds. Raises FileTooCostly over a
    bound, OSError when unreadable, ValueError (json.JSONDecodeError) when not JSON."""
    check_size(path, max_bytes)
    data = path.read_bytes()
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise FileTooCostly(f"JSON nested deeper than {MAX_JSON_DEPTH} levels ({depth}); a log_summary has 4")
    return json.loads(data.decode("utf-8", errors="replace"))


@dataclass
class Parsed:
    """Rows per (table, rank) in schema order, plus run-level hints.

    Rows are kept up to MAX_FILE_ROWS; one more, and the file's rows are dropped and it is
    reported, so a parser never holds more (``refused`` then says so and ``add`` keeps nothing)."""

    rows: dict[tuple[str, int], list[dict]] = field(default_factory=lambda: defaultdict(list))
    problems: list[Problem] = field(default_factory=list)
    world_size: int | None = None  # when the file says (summary metadata, profiler header)
    sources: list[str] = field(default_factory=list)
    hints: dict = field(default_factory=dict)  # a format's facts that its settle() reads across files
    refused: bool = False
    _kept: int = 0
    _problems_seen: int = 0

    def add(self, table: str, rank: int, where: str = "", **row) -> bool:
        """Keep one row; a value the store cannot hold (an integer outside int64, a string
        over MAX_FIELD_CHARS) turns the row into a problem at ``where`` instead. Returns
        whether it was kept."""
        return self.add_repeated(table, rank, where, 1, row)

    def add_repeated(self, table: str, rank: int, where: str, count: int, row: dict) -> bool:
        """Keep ``count`` copies of ``row``: one dict, checked once, referenced ``count`` times
        (rows are never changed after they are added)."""
        if self.refused:
            return False
        problem = _out_of_bounds(table, rank, row)
        if problem:
            self.problem(self.sources[0] if self.sources else "?", where, f"{problem}; row skipped")
            return False
        if self._kept + count > MAX_FILE_ROWS:
            self.refuse(where, f"more than {MAX_FILE_ROWS:,} rows; file skipped (split it, or import it in parts)")
            return False
        self._kept += count
        rows = self.rows[(table, rank)]
        if count == 1:
            rows.append(row)
        else:
            rows.extend([row] * count)
        return True

    def refuse(self, where: str, message: str) -> Parsed:
        """Drop every row of this file and report why at ``where``; returns self."""
        self.rows.clear()
        self.refused = True
        self._kept = 0
        self.problem(self.sources[0] if self.sources else "?", where, message)
        return self

    def problem(self, path, where: str, message: str) -> None:
        """Report one problem; past MAX_PROBLEMS in one file, one line says the rest are not listed."""
        if self._problems_seen < MAX_PROBLEMS:
            self.problems.append(Problem(str(path), where, message))
        elif self._problems_seen == MAX_PROBLEMS:
            self.problems.append(Problem(str(path), "", f"more than {MAX_PROBLEMS} problems; the rest are not listed"))
        self._problems_seen += 1

    def unreadable(self, path, exc: OSError) -> Parsed:
        """Record that ``path`` could not be read at all; returns self, the (empty) result."""
        self.problem(path, "", f"cannot read: {exc.strerror}")
        return self

    def merge(self, other: Parsed) -> None:
        for key, rows in other.rows.items():
            self.rows[key].extend(rows)
        self.problems.extend(other.problems)
        self.sources.extend(other.sources)
        self.hints.update(other.hints)
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


def set_bandwidth(row: dict) -> None:
    """A comm row's algbw/busbw from its bytes, times and group size, once a settle() has decided
    what they were left without (its dtype, its group); a row without bytes or an end keeps none."""
    if row["bytes"] and row["end_ns"] is not None:
        duration = row["end_ns"] - row["start_ns"]
        row["algbw_gbs"], row["busbw_gbs"] = bandwidth.bandwidth(row["op"], row["bytes"], duration, row["group_size"])


WORLD_DESC = "default_pg"  # torch's description of the default group, in dumps and traces


def group_names(
    members: dict[str, list[int]], world: str | None, roles: dict[str, str] | None = None
) -> dict[str, str]:
    """Group key -> rankscope's group name, as the hook names groups: ``world`` for the key
    ``world``, ``<role>[<ranks>]`` for the others (the description a group was made with, ``tp``,
    where ``roles`` has one; else ``g``), ``#<key>`` after a name two groups would share."""
    names, taken = {}, set()
    for key in sorted(members, key=lambda k: (k != world, len(k), k)):
        name = "world" if key == world else group_name((roles or {}).get(key), rank_ranges(members[key]))
        if name in taken:
            name += f"#{key}"
        names[key] = name
        taken.add(name)
    return names


def _out_of_bounds(table: str, rank: int, row: dict) -> str | None:
    """Why ``row`` cannot be stored in ``table``, or None when it can."""
    if not 0 <= rank < MAX_WORLD_SIZE:  # every rank below it becomes a stream of its own
        return f"rank {rank} is out of range (0 to {MAX_WORLD_SIZE - 1:,})"
    types = TABLES[table].column_types
    for name, value in row.items():
        # the column's type is looked up only for a value that may not fit (this runs for every row imported)
        if type(value) is int:
            if INT64_MIN <= value <= INT64_MAX:
                continue
        elif type(value) is str:
            if len(value) <= MAX_FIELD_CHARS:
                continue
        elif not isinstance(value, int | str):
            continue
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
