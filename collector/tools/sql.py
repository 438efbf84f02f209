"""``rankscope sql [--data-dir D] QUERY``: one read-only query, printed as an aligned table."""

from __future__ import annotations

import sys
from typing import TextIO

import pyarrow as pa

from collector.data.catalog import QueryError, SqlLimits, run_readonly_query

MAX_ROWS = 10_000
MAX_CELL_CHARS = 80


def _cell(value) -> str:
    if value is None:
        return "NULL"
    text = value if isinstance(value, str) else str(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "…"


def format_table(table: pa.Table) -> str:
    """Columns padded to their widest cell; numbers right-aligned, like duckdb's CLI."""
    names = table.column_names
    columns = [[_cell(v) for v in col.to_pylist()] for col in table.columns]
    numeric = [pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) for t in table.schema.types]
    widths = [max([len(n), *map(len, cells)]) for n, cells in zip(names, columns)]

    def line(cells):
        padded = (c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric))
        return " | ".join(padded).rstrip()

    out = [line(names), "-+-".join("-" * w for w in widths)]
    out += [line(row) for row in zip(*columns)]
    return "\n".join(out)


def run(
    data_dir, query: str, out: TextIO = sys.stdout, err: TextIO = sys.stderr, limits: SqlLimits | None = None
) -> int:
    """Print the result of ``query`` over D's catalog; 0 on success, 1 with a message on error
    (a query stopped by a limit says which). ``limits``: None resolves them from the environment."""
    try:
        limits = limits or SqlLimits.resolve()
    except ValueError as exc:
        print(f"rankscope sql: {exc}", file=err)
        return 2
    try:
        # One row past the limit tells us whether the result was cut.
        result = run_readonly_query(
            data_dir, query, max_rows=MAX_ROWS + 1, timeout_s=limits.time_s, memory_limit=limits.memory_bytes
        )
    except QueryError as exc:
        print(f"rankscope sql: {exc}", file=err)
        return 1
    shown = result.slice(0, MAX_ROWS)
    print(format_table(shown), file=out)
    if result.num_rows > MAX_ROWS:
        print(f"(more than {MAX_ROWS} rows; showing the first {MAX_ROWS}, add a LIMIT)", file=out)
    else:
        print(f"({shown.num_rows} row{'' if shown.num_rows == 1 else 's'})", file=out)
    return 0
