"""Snapshots: which segment files a reader takes, so every view of one query sees one commit.

A collector publishes, after every commit, the list of files readers take per table
(``D/ledger/manifest.json``, one per writer; collector/server/ledger.py): hard links under
``D/snapshot/`` that stay readable a grace period after a merge replaced them. The views read
``read_parquet`` over the list in the connection's ``rankscope_segments`` variable, which ``pin``
sets from the manifests: every view of one query sees the same commit, whatever flush,
compaction, rollup or retention pass runs meanwhile, and no file it names is deleted under it.
``catalog.connect`` pins once (a short-lived connection: export, tools); ``queries.Catalog``
pins every query's cursor (the dashboard, health, /metrics); the SQL guard reads the manifest
for each query. Without the variable -- a data dir with no manifest (written before, or copied
without its ledger), or a plain DuckDB session on the catalog -- the views list the partition
folders with a glob, as before. Why not an open table format (Delta Lake, Iceberg): they solve
the same problem with a log readers replay and a vacuum after a retention period -- what this
is, in ~150 lines -- but would add a dependency to every reader, rewrite the layout plain
DuckDB and the archives read (``parquet/<table>/run=<id>/``), and put a log replay in front of
each dashboard query; a manifest rename keeps the layout and costs one small file read.

A segment that vanished under a query (compaction merged it) is retried (``with_segment_retry``);
one that does not read is named (``damaged_segment``, ``segment_problem``) and left out.
"""

from __future__ import annotations

import json
import re
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from collector.data import layout
from collector.data.views import SEGMENTS_VARIABLE

T = TypeVar("T")


def snapshot_files(data_dir) -> dict[str, list[str]] | None:
    """table -> the files (relative to D) of the latest commit, from the writers' manifests; None
    when D has none (a data dir written before manifests, copied without its ledger, or never
    written by a collector): then the partition folders are the list."""
    root = Path(data_dir)
    ledger = root / layout.LEDGER_DIR
    if not (root / layout.SNAPSHOT_DIR).is_dir() or not ledger.is_dir():
        return None
    tables: dict[str, set[str]] = {}
    unlisted: list[str | None] = []  # writers whose ledger has no manifest (an older collector's)
    found = False
    for folder in [ledger, *sorted(ledger.glob("writer=*"))]:
        writer = folder.name.removeprefix("writer=") if folder != ledger else None
        try:
            manifest = json.loads((folder / layout.MANIFEST_FILE).read_text())
        except FileNotFoundError:
            if any(folder.glob("log-*.jsonl")):
                unlisted.append(writer)
            continue
        except (OSError, ValueError):
            return None  # damaged (a crash before the next start rewrites it): list the folders
        found = True
        for table, files in manifest["tables"].items():
            tables.setdefault(table, set()).update(files)
    if not found:
        return None
    # Files under parquet/ are ones no writer deletes (put there by hand or by git: only a person
    # removes them, and the manifest learns of it at the compactor's next pass) or, on a filesystem
    # without hard links, segments themselves: take those that are still there.
    snapshot_prefix = f"{layout.SNAPSHOT_DIR}/"
    for files in tables.values():
        files.difference_update([f for f in files if not f.startswith(snapshot_prefix) and not (root / f).exists()])
    if unlisted:
        names = [layout.segment_name_re(w) for w in unlisted]
        for seg in (root / layout.PARQUET_DIR).glob(f"*/{layout.PARTITION_PREFIX}*/*{layout.SEGMENT_SUFFIX}"):
            if any(n.match(seg.stem) for n in names):
                tables.setdefault(seg.parent.parent.name, set()).add(seg.relative_to(root).as_posix())
    return {t: sorted(files) for t, files in tables.items()}


def _listed_files(root: Path, table: str) -> list[str]:
    """Every segment in ``table``'s partition folders, relative to D (the list without a manifest)."""
    return [
        p.relative_to(root).as_posix()
        for p in sorted(layout.table_dir(root, table).glob(f"run=*/*{layout.SEGMENT_SUFFIX}"))
        if p.parent.name != layout.PLACEHOLDER_PARTITION
    ]


def partition_path_of(data_dir, path) -> Path:
    """The name a user knows a file by: ``D/parquet/...`` for the snapshot link ``D/snapshot/...``
    of a segment (the same file), ``path`` itself otherwise."""
    root, path = Path(data_dir).resolve(), Path(path)
    try:
        return root / layout.PARQUET_DIR / path.relative_to(root / layout.SNAPSHOT_DIR)
    except ValueError:
        return path


def _placeholder(table: str) -> str:
    return f"{layout.PARQUET_DIR}/{table}/{layout.PLACEHOLDER_PARTITION}/{layout.PLACEHOLDER_FILE}"


def pin(con: duckdb.DuckDBPyConnection, data_dir, skip: set[str] | frozenset[str] = frozenset()) -> None:
    """Point ``con``'s views at the snapshot of D as it is now (one read of each manifest),
    leaving out the ``skip`` segments (absolute paths of files found unreadable). Without a
    manifest and nothing to skip, the views keep listing the partition folders."""
    root = Path(data_dir).resolve()
    files = snapshot_files(root)
    if files is None and not skip:
        con.execute(f"RESET VARIABLE {SEGMENTS_VARIABLE}")
        return
    value = {}
    for table in layout.stored_schemas():
        listed = files.get(table, []) if files is not None else _listed_files(root, table)
        if skip:
            listed = [f for f in listed if str(partition_path_of(root, root / f)) not in skip]
        value[table] = "\n".join([_placeholder(table), *listed])
    con.execute(f"SET VARIABLE {SEGMENTS_VARIABLE} = ?", [value])


_SEGMENT_IN_ERROR_RE = re.compile(r"'([^']+\.parquet)'")


def damaged_segment(data_dir, message: str) -> str | None:
    """The segment of D a DuckDB error names, when that file indeed does not read; else None."""
    root = Path(data_dir).resolve()
    trees = (root / layout.PARQUET_DIR, root / layout.SNAPSHOT_DIR)
    for match in _SEGMENT_IN_ERROR_RE.finditer(message):
        path = (root / match.group(1)).resolve()
        if not any(tree in path.parents for tree in trees) or not path.is_file():
            continue
        try:
            pq.ParquetFile(path).read()
        except (OSError, pa.ArrowException):
            return str(partition_path_of(root, path))
    return None


def readable_segments(data_dir, table: str, snapshot: dict[str, list[str]] | None = None) -> list[str]:
    """Every segment of ``table`` in D's snapshot (``snapshot_files``, read now unless given)
    whose Parquet footer reads; one that does not is left out with a warning naming it (the
    collector quarantines it; until then, or in a copied data dir, it must not fail queries
    about other runs and tables)."""
    root = Path(data_dir).resolve()
    if snapshot is None:
        snapshot = snapshot_files(root)
    listed = snapshot.get(table, []) if snapshot is not None else _listed_files(root, table)
    files = []
    for path in (root / f for f in listed):
        problem = segment_problem(path)
        if problem:
            named = partition_path_of(root, path)
            warnings.warn(f"skipping unreadable segment {named}: {problem}", UnreadableSegmentWarning, stacklevel=2)
            continue
        files.append(str(path))
    return files


class UnreadableSegmentWarning(UserWarning):
    """A segment a reader left out because its footer or schema cannot be read."""


def segment_problem(path) -> str | None:
    """Why the Parquet file at ``path`` cannot be read (footer, schema), or None when it can."""
    try:
        pq.read_metadata(path)
    except FileNotFoundError:
        return None  # compacted away since it was listed; the retry lists the merged file
    except (OSError, pa.ArrowException) as exc:
        return str(exc) or type(exc).__name__
    return None


def with_segment_retry(query: Callable[[], T], attempts: int = 5) -> T:
    """Run ``query``, again if a segment vanished under it.

    Compaction unlinks merged segments; a query that listed the files just before
    then fails to open one. Running it again lists the merged file instead."""
    for attempt in range(attempts):
        try:
            return query()
        except (duckdb.IOException, duckdb.InvalidInputException, FileNotFoundError) as exc:
            # IOException from DuckDB's own reader; from the guard's Arrow datasets, FileNotFoundError
            # while opening one and InvalidInputException while scanning it
            vanished = isinstance(exc, FileNotFoundError) or "No such file" in str(exc)
            if not vanished or attempt == attempts - 1:
                raise
            time.sleep(0.01 * (attempt + 1))
    raise AssertionError("unreachable")
