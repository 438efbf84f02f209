"""Where things live in a data dir D, and the schema of every stored table.

    D/parquet/<table>/run=<run_id>/<segment>.parquet   committed segments
    D/parquet/<table>/run=@schema/schema.parquet      empty placeholder (see below)
    D/parquet/<runs|ranks|rank_ends|rank_events>/run=@all/<segment>.parquet
                                                       those tables' rows of many runs (see below)
    D/ledger/                                          the store's commit log (collector/ledger.py)
    D/ledger/writer=<w>/                               the log of writer <w>, when several collectors
                                                       share D (docs/SCALING.md)
    D/catalog.duckdb                                   views only (collector/catalog.py)
    D/ledger[/writer=<w>]/manifest.json                the files readers take, per table (snapshot reads)
    D/snapshot/<table>/run=<run_id>/<segment>.parquet  hard links to committed segments, which readers read

Segments are written as ``.<name>.tmp`` and renamed into place; the view globs
(``run=*/*.parquet``) never match a temporary name, so readers never see a
half-written file.

Every table gets a zero-row placeholder file in the ``run=@schema`` partition:
DuckDB refuses to bind a view over a glob that matches nothing, and the
placeholder also carries the current schema so ``union_by_name`` fills columns
that older segments lack with nulls. ``@`` is not allowed in a run_id, so the
placeholder partition can never collide with a real run, and it holds no rows.

The collector's own tables (``COLLECTOR_TABLES``: a row or two per rank per run, from Hello and
RunEnd) are written into their run's partition like any other, then folded by compaction into
the shared partition ``run=@all`` (collector/server/compaction.py): 10,000 runs are a few files
there, not a file per table per run, so ``runs`` and ``ranks`` read a compact table and the
collector's periodic passes do not walk a folder per run. ``run_id`` is a column of those
tables, so nothing reads the run from their folder names.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from collector.data.schema import (
    COMM_STEPS_SCHEMA,
    DELIVERIES_SCHEMA,
    RANK_ENDS_SCHEMA,
    RANK_EVENTS_SCHEMA,
    RANKS_SCHEMA,
    RUNS_SCHEMA,
    STEP_ANALYSIS_SCHEMA,
    TABLES,
    UNSETTLED_INSTANCES_SCHEMA,
)

# \Z, not $: "$" also matches before a trailing newline, and "run\n" as a partition
# directory name breaks every catalog view (found by tests/integration/server/test_fuzz.py).
RUN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}\Z")

PARQUET_DIR = "parquet"
LEDGER_DIR = "ledger"
QUARANTINE_DIR = "quarantine"  # segments the collector found unreadable, moved out of every reader's way
CATALOG_FILE = "catalog.duckdb"
# Readers' view of the committed segments (collector/server/ledger.py): each writer publishes
# D/ledger[/writer=<w>]/manifest.json naming, per table, the files of its latest commit, as hard
# links under D/snapshot/<table>/run=<id>/ that outlive a merge by a grace period.
SNAPSHOT_DIR = "snapshot"
MANIFEST_FILE = "manifest.json"
PLACEHOLDER_PARTITION = "run=@schema"
SHARED_RUN = "@all"  # the partition of the collector tables' rows of many runs (see above)
SHARED_PARTITION = f"run={SHARED_RUN}"
PLACEHOLDER_FILE = "schema.parquet"
SEGMENT_SUFFIX = ".parquet"
TEMP_SUFFIX = ".tmp"

# Tables the collector writes from Hello / RunEnd messages; run_id is a column
# there (and also the partition), unlike the per-rank tables.
COLLECTOR_TABLES: dict[str, pa.Schema] = {
    "runs": RUNS_SCHEMA,
    "ranks": RANKS_SCHEMA,
    "rank_ends": RANK_ENDS_SCHEMA,
    "rank_events": RANK_EVENTS_SCHEMA,
}

# Tables the collector derives from stored rows once their steps settle (compaction's per-step
# comm rollup and step analysis); per rank like TABLES: run_id is the partition only.
DERIVED_TABLES: dict[str, pa.Schema] = {
    "comm_steps": COMM_STEPS_SCHEMA,
    "step_analysis": STEP_ANALYSIS_SCHEMA,
    "unsettled_instances": UNSETTLED_INSTANCES_SCHEMA,
    # made at intake, not from settled steps: each accepted envelope's delivery (collector.data.deliveries)
    "deliveries": DELIVERIES_SCHEMA,
}


def new_run_id(name: str, stable_key: str | None = None) -> str:
    """A run id for a run called ``name``: its safe part, the UTC time and a random suffix, so a
    second run of the same name gets a new id; with ``stable_key`` (a watched folder), the same
    id every time for the same key instead."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-")[:80] or "run"
    if stable_key is not None:
        return f"{safe}-{hashlib.sha256(stable_key.encode()).hexdigest()[:8]}"
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


class RunIdError(ValueError):
    """A run id that cannot name a partition; the message says what is allowed."""


def check_run_id(run_id: str) -> str:
    if not RUN_ID_RE.match(run_id or "") or run_id in (".", ".."):
        raise RunIdError(f"run_id {run_id!r} is not allowed: use 1-128 of [A-Za-z0-9_.-]")
    return run_id


# Several collectors may share one data dir, each under its own writer id: its
# segments are named seg-<w>-<commit>-<part> / cmp-<w>-..., its ledger is
# D/ledger/writer=<w>/, and it recovers, compacts and deletes only its own files.
# Without a writer id (one collector per D) names stay seg-<commit>-<part>.
WRITER_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}\Z")


def check_writer(writer: str | None) -> str | None:
    if writer is not None and not WRITER_RE.match(writer):
        raise ValueError(f"writer id {writer!r} is not allowed: use 1-32 of [a-z0-9_], starting with a letter")
    return writer


def segment_prefix(kind: str, writer: str | None) -> str:
    """'seg' / 'cmp', or 'seg-<writer>' / 'cmp-<writer>' for a named writer."""
    return f"{kind}-{writer}" if writer else kind


def segment_name_re(writer: str | None) -> re.Pattern:
    """Matches the stems of exactly this writer's segments: groups (kind, commit, part)."""
    middle = f"-{re.escape(writer)}" if writer else ""
    return re.compile(rf"^(seg|cmp){middle}-(\d+)-(\d+)\Z")


# Any writer's segment name (seg-/cmp-, with or without a writer id): what no writer calls foreign.
ANY_WRITER_SEGMENT_RE = re.compile(r"^(seg|cmp)(-[a-z][a-z0-9_]{0,31})?-(\d+)-(\d+)\Z")


def snapshot_link(data_dir: Path, segment: Path) -> Path:
    """Where readers find committed segment ``D/parquet/<table>/run=<id>/<name>``: its hard link
    ``D/snapshot/<table>/run=<id>/<name>``."""
    return data_dir / SNAPSHOT_DIR / segment.relative_to(data_dir / PARQUET_DIR)


def ledger_dir(data_dir: Path, writer: str | None) -> Path:
    base = data_dir / LEDGER_DIR
    return base / f"writer={writer}" if writer else base


def stored_schemas() -> dict[str, pa.Schema]:
    """Every table stored under D/parquet with the schema of its files."""
    schemas = {name: table.arrow_schema() for name, table in TABLES.items()}
    schemas.update(COLLECTOR_TABLES)
    schemas.update(DERIVED_TABLES)
    return schemas


def table_dir(data_dir: Path, table: str) -> Path:
    return data_dir / PARQUET_DIR / table


def placeholder_path(data_dir: Path, table: str) -> Path:
    """``table``'s empty file with its schema, so its view reads before any segment exists."""
    return table_dir(data_dir, table) / PLACEHOLDER_PARTITION / PLACEHOLDER_FILE


PARTITION_PREFIX = "run="


def partition_dir(data_dir: Path, table: str, run_id: str) -> Path:
    return table_dir(data_dir, table) / f"{PARTITION_PREFIX}{run_id}"


def run_of(partition: Path) -> str | None:
    """The run id a ``run=<id>`` partition folder holds; None for the placeholder or another folder."""
    name = partition.name
    if name == PLACEHOLDER_PARTITION or not name.startswith(PARTITION_PREFIX):
        return None
    return name.removeprefix(PARTITION_PREFIX)


def is_shared(partition: Path) -> bool:
    """Whether ``partition`` is a collector table's ``run=@all``, which holds rows of many runs."""
    return partition.name == SHARED_PARTITION


def partitions(data_dir: Path, table: str | None = None) -> list[Path]:
    """Every run partition (not the placeholder; the shared ``run=@all`` of the collector tables
    included) of ``table``, or of every table, sorted."""
    base = data_dir / PARQUET_DIR
    pattern = f"{table if table else '*'}/{PARTITION_PREFIX}*"
    return sorted(p for p in base.glob(pattern) if p.is_dir() and run_of(p) is not None)


def temp_name(final: Path) -> Path:
    """The name a segment is written under before it is committed."""
    return final.with_name(f".{final.name}{TEMP_SUFFIX}")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_placeholders(data_dir: Path) -> None:
    """Write (or refresh, after a schema change) each table's empty placeholder."""
    for table, schema in stored_schemas().items():
        path = placeholder_path(data_dir, table)
        if path.exists():
            try:
                if pq.read_schema(path).equals(schema):
                    continue
            except (OSError, pa.ArrowInvalid):
                pass  # unreadable: rewrite it below
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(path).with_suffix(f".{os.getpid()}")
        pq.write_table(schema.empty_table(), tmp)
        os.replace(tmp, path)


def placeholders_present(data_dir: Path) -> bool:
    """Whether every table's placeholder exists (their schemas are not read: see catalog._catalog_version)."""
    return all(placeholder_path(data_dir, table).is_file() for table in stored_schemas())


def is_data_dir(path: Path) -> bool:
    """A directory the collector (or ``ensure_catalog``) has written: it has parquet/ or the catalog."""
    return path.is_dir() and ((path / PARQUET_DIR).is_dir() or (path / CATALOG_FILE).is_file())


def check_data_dir(path: Path, error: type[Exception] = FileNotFoundError) -> Path:
    """``path`` itself when it is a data dir; otherwise raise ``error`` saying what it is instead.
    Commands that only read refuse anything else rather than create a catalog in it."""
    if not path.exists():
        raise error(f"data dir {str(path)!r} does not exist")
    if not is_data_dir(path):
        raise error(
            f"{str(path)!r} is not a rankscope data dir (it has no {PARQUET_DIR}/ or {CATALOG_FILE}); "
            "point --data-dir at the directory the collector writes"
        )
    return path
