"""A Parquet file of one rankscope table, as ``rankscope export --parquet`` writes it
(``<table>.parquet`` with ``run_id`` and ``rank`` columns, the table's name also in
the schema metadata under ``rankscope.table``). Its rows are imported into the new
run; run_id is replaced, every other column kept. A file that Parquet cannot read
(truncated, not Parquet) is reported and skipped."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from collector.data.schema import TABLES
from collector.tools.importers import base, osdi_trace
from collector.tools.importers.base import Parsed

NAME = "parquet"
TABLE_KEY = b"rankscope.table"
_COLLECTOR_TABLES = ("runs", "ranks", "rank_ends")


def detect(path: Path) -> bool:
    """A .parquet file, unless it holds one of the collector's own tables (runs, ranks...),
    which ``export --parquet`` writes beside the data and an import does not take."""
    if path.suffix != ".parquet":
        return False
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException):
        return True  # unreadable: parse() reports it
    if osdi_trace.is_trace_schema(schema):
        return False  # the OSDI'25 study's trace format: osdi_trace imports it
    return table_name(path, schema) is not None or path.stem not in _COLLECTOR_TABLES


def table_name(path: Path, schema: pa.Schema) -> str | None:
    meta = schema.metadata or {}
    name = meta.get(TABLE_KEY, path.stem.encode()).decode()
    return name if name in TABLES else None


def parse(path: Path) -> Parsed:
    out = Parsed(sources=[str(path)])
    try:
        # the footer first: a constant column compresses to almost nothing, so a small file may
        # decode to any number of rows; refuse it before reading them
        meta = pq.ParquetFile(path).metadata
        if meta.num_rows > base.MAX_FILE_ROWS:
            return out.refuse(
                "",
                f"holds {meta.num_rows:,} rows, more than the {base.MAX_FILE_ROWS:,} one file may become; file skipped",
            )
        decoded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        if decoded > base.MAX_FILE_BYTES:
            return out.refuse(
                "",
                f"decodes to {base.size_text(decoded)}, more than {base.size_text(base.MAX_FILE_BYTES)}; file skipped",
            )
        data = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        out.problem(path, "", f"unreadable Parquet ({exc}); skipped")
        return out
    table = table_name(path, data.schema)
    if table is None:
        out.problem(path, "", f"not a rankscope table (name it <table>.parquet, one of {', '.join(TABLES)})")
        return out
    if "rank" not in data.column_names:
        out.problem(path, "", "has no 'rank' column")
        return out
    wanted = [n for n in TABLES[table].arrow_schema().names[1:] if n in data.column_names]
    for row in data.select(["rank", *wanted]).to_pylist():
        rank = row.pop("rank")
        if rank is None or rank < 0:
            out.problem(path, "", f"a row with rank {rank!r}; skipped")
            continue
        out.add(table, rank, **row)
    return out
