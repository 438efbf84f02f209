"""The DuckDB catalog: views over the Parquet segments, and read-only access.

``D/catalog.duckdb`` holds views only, with paths relative to D, so a data dir
can be moved or copied (``sample_runs/`` is one). ``connect(D)`` opens it
read-only with ``file_search_path`` set to D, which is what DuckDB resolves the
relative ``read_parquet`` paths against, whatever the process's cwd.

The catalog file is never held open by a writer: ``ensure_catalog`` builds a
fresh file under a temporary name and renames it over the old one, so readers
in other processes (dashboard, ``rankscope sql``) are never locked out; a
reader that already had the old file open keeps reading the same Parquet.

Readers see snapshots. A collector publishes, after every commit, the list of files readers
take per table (``D/ledger/manifest.json``, one per writer; collector/server/ledger.py): hard
links under ``D/snapshot/`` that stay readable a grace period after a merge replaced them. The
views read ``read_parquet`` over the list in the connection's ``rankscope_segments`` variable,
which ``pin`` sets from the manifests: every view of one query sees the same commit, whatever
flush, compaction, rollup or retention pass runs meanwhile, and no file it names is deleted
under it. ``connect`` pins once (a short-lived connection: export, tools); ``queries.Catalog``
pins every query's cursor (the dashboard, health, /metrics); the SQL guard reads the manifest
for each query. Without the variable -- a data dir with no manifest (written before, or copied
without its ledger), or a plain DuckDB session on the catalog -- the views list the partition
folders with a glob, as before. Why not an open table format (Delta Lake, Iceberg): they solve
the same problem with a log readers replay and a vacuum after a retention period -- what this
is, in ~150 lines -- but would add a dependency to every reader, rewrite the layout plain
DuckDB and the archives read (``parquet/<table>/run=<id>/``), and put a log replay in front of
each dashboard query; a manifest rename keeps the layout and costs one small file read.

``run_readonly_query`` is the guard for user-typed SQL (``rankscope sql``, the
dashboard console): one query statement, run in a private in-memory database
whose only readable directory is D/parquet.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from collector.data import clocks, layout
from collector.data.instances import instances_sql, join_condition
from collector.data.schema import TABLES, reading_schema

T = TypeVar("T")
VERSION_VIEW = "rankscope_catalog_version"
# Statement types a user query may have; DESCRIBE/SHOW/SUMMARIZE/FROM parse as SELECT.
_QUERY_TYPES = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}
QUERY_TIMEOUT_S = 30.0  # a user query running longer is interrupted (a runaway recursive CTE, a huge join)
SQL_MEMORY_LIMIT = 1 << 30  # what one user query may hold (DuckDB's own default is 80% of the machine's RAM)
SQL_MEMORY_LIMIT_ENV = "RANKSCOPE_SQL_MEMORY_LIMIT"
SQL_TIME_LIMIT_ENV = "RANKSCOPE_SQL_TIME_LIMIT"


class QueryError(Exception):
    """A user query that was refused or failed; the message is DuckDB's or ours."""


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


SEGMENTS_VARIABLE = "rankscope_segments"  # table -> the snapshot's files, newline-separated (see ``pin``)


def _scan(root: str | None, table: str, *, hive: bool) -> str:
    """read_parquet over the pinned snapshot's files of ``table`` or, with none pinned, over every
    segment in its partition folders; root is '' (relative to D). ``root=None`` names the Arrow
    dataset the SQL guard registers instead (see ``readonly_connection``)."""
    if root is None:
        return quote_ident(_guard_relation(table))
    # run=* only: a stray folder dropped under parquet/<table>/ by hand must not break the hive scan
    glob = quote_literal(f"{root}{layout.PARQUET_DIR}/{table}/run=*/*{layout.SEGMENT_SUFFIX}")
    pinned = f"string_split(getvariable({quote_literal(SEGMENTS_VARIABLE)})[{quote_literal(table)}], chr(10))"
    glob = f"coalesce({pinned}, [{glob}])"
    if hive:
        return f"read_parquet({glob}, hive_partitioning = true, union_by_name = true, hive_types = {{'run': VARCHAR}})"
    return f"read_parquet({glob}, hive_partitioning = false, union_by_name = true)"


def _columns(names) -> str:
    return ", ".join(quote_ident(n) for n in names)


def _base_views(root: str | None) -> dict[str, str]:
    """The views that read segments: one per stored table (``_<name>_raw`` for the collector's)."""
    views: dict[str, str] = {}
    for name, table in TABLES.items():
        scan = _scan(root, name, hive=True)
        views[name] = f'SELECT "run" AS run_id, {_columns(table.arrow_schema().names)} FROM {scan}'
    for name, schema in layout.DERIVED_TABLES.items():
        scan = _scan(root, name, hive=True)
        views[name] = f'SELECT "run" AS run_id, {_columns(schema.names)} FROM {scan}'
    for name, schema in layout.COLLECTOR_TABLES.items():
        scan = _scan(root, name, hive=False)
        views[f"_{name}_raw"] = f"SELECT {_columns(schema.names)} FROM {scan}"
    return views


def desyncs_sql(completed: str) -> str:
    """The ``desyncs`` statement over ``completed`` (run_id, rank, group_name, seq, op, dtype, numel:
    the collective rows that completed) and the in-flight ones. queries.desyncs runs it over the
    instances compaction could not settle plus the raw rows after them."""
    return f"""
        WITH entered AS (
            {completed}
            UNION ALL
            SELECT run_id, rank, group_name, seq, op, dtype, numel FROM inflight_latest),
        -- Almost every instance agrees: find the few that do not with one cheap aggregate (a hash of
        -- the signature, NULLs included), and list the sides of those alone.
        odd AS (
            SELECT run_id, group_name, seq FROM entered GROUP BY ALL
            HAVING min(hash(op, dtype, numel)) <> max(hash(op, dtype, numel))),
        per_rank AS (SELECT DISTINCT * FROM entered SEMI JOIN odd USING (run_id, group_name, seq)),
        sides AS (
            SELECT run_id, group_name, seq, op, dtype, numel, list(rank ORDER BY rank) AS ranks
            FROM per_rank GROUP BY ALL)
        SELECT run_id, group_name, seq,
               list({{'op': op, 'dtype': dtype, 'numel': numel, 'ranks': ranks}} ORDER BY len(ranks) DESC, ranks)
                   AS sides,
               count(*) AS n_sides
        FROM sides GROUP BY run_id, group_name, seq HAVING count(*) > 1"""


def view_definitions(root: str | None = "") -> dict[str, str]:
    """View name -> SELECT text. ``root`` prefixes every Parquet path (None: the guard's datasets)."""
    views = _base_views(root)

    # A rank that reconnects says Hello again: keep its latest Hello, and its latest RunEnd.
    views["rank_ends"] = """
        SELECT * FROM _rank_ends_raw
        QUALIFY row_number() OVER (PARTITION BY run_id, rank ORDER BY ended_at DESC) = 1"""
    views["ranks"] = """
        WITH hello AS (
            SELECT * FROM _ranks_raw
            QUALIFY row_number() OVER (PARTITION BY run_id, rank ORDER BY started_at DESC, client_id) = 1)
        SELECT h.run_id, h.rank, h.host, h.pid, h.clock_offset_ns, h.client_id, h.started_at,
               e.ended_at, coalesce(e.status, 'running') AS status, e.dropped_records
        FROM hello h LEFT JOIN rank_ends e USING (run_id, rank)"""
    # First Hello of a run wins; a run is finished once every rank of world_size sent
    # RunEnd(finished), failed as soon as one rank failed.
    views["runs"] = """
        WITH first_hello AS (
            SELECT * FROM _runs_raw
            QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY started_at) = 1),
        per_run AS (
            SELECT run_id, count(*) AS n_ranks,
                   count(*) FILTER (WHERE status = 'failed') AS n_failed,
                   count(*) FILTER (WHERE status = 'finished') AS n_finished,
                   max(ended_at) AS last_end
            FROM ranks GROUP BY run_id),
        judged AS (
            SELECT h.*, coalesce(p.n_ranks, 0) AS n_ranks, p.last_end,
                   CASE WHEN coalesce(p.n_failed, 0) > 0 THEN 'failed'
                        WHEN coalesce(p.n_finished, 0) >= h.world_size THEN 'finished'
                        ELSE 'running' END AS status
            FROM first_hello h LEFT JOIN per_run p USING (run_id))
        SELECT run_id, name, world_size, started_at,
               CASE WHEN status <> 'running' THEN last_end END AS ended_at,
               status, source, linked_run_id, config, n_ranks
        FROM judged"""
    # One collective instance, as collector.data.instances defines it, and each rank's part in it,
    # with the times of a rank whose clock is off beyond its Hello offset corrected (collector.data.clocks).
    keys = ("run_id", "group_name", "seq")
    views["comm_clock_fixes"] = clocks.fixes_sql("comm", ("run_id",))
    fixed = clocks.fixed_sql("comm", "comm_clock_fixes", ("run_id",))
    views["comm_instances"] = f"""
        WITH fixed AS ({fixed}), inst AS ({instances_sql("fixed", keys)})
        SELECT c.run_id, c.group_name, c.seq, c.rank, c.op, c.bytes, c.step, c.start_ns, c.end_ns,
               c.start_ns - i.first_ns AS arrival_delay_ns, i.last_ns - c.start_ns AS wait_ns,
               c.rank = i.last_rank AS is_last, i.n_ranks
        FROM fixed c JOIN inst i ON {join_condition("c", "i", keys)}"""
    views["stragglers"] = f"""
        WITH fixed AS ({fixed}), inst AS ({instances_sql("fixed", keys)})
        SELECT i.run_id, i.group_name, i.seq, any_value(c.op) AS op, min(c.step) AS step, i.last_rank,
               i.last_ns - i.first_ns AS max_delay_ns, i.n_ranks
        FROM inst i JOIN fixed c ON {join_condition("c", "i", keys)}
        GROUP BY i.run_id, i.group_name, i.seq, i.last_rank, i.first_ns, i.last_ns, i.n_ranks"""
    views.update(liveness_views())
    return views


# A group's members from its range label ("0-3,8" -> [0, 1, 2, 3, 8]); a report without a label
# (none today) falls back to ranks 0..size-1.
_MEMBERS = """CASE WHEN coalesce(group_ranks, '') = '' THEN range(0, group_size) ELSE flatten(list_transform(
        string_split(group_ranks, ','), lambda x: CASE WHEN contains(x, '-')
            THEN range(split_part(x, '-', 1)::BIGINT, split_part(x, '-', 2)::BIGINT + 1)
            ELSE [x::BIGINT] END)) END"""


def liveness_views() -> dict[str, str]:
    """Hangs, collective mismatches, silent ranks and the wavefront (collector.rank.watchdog
    writes what they read; collector.data.findings.{hang,desync,silent} judge them).

    - ``inflight_open``: each collective a rank reported in flight and still is: its newest report
      (``waiting_s`` = report time - entry time), unless the rank completed it (a comm row), ended,
      or beat since without reporting it (it left flight without a record: the call raised).
    - ``hangs``: one row per instance (run_id, group_name, seq) that a rank has waited in for at
      least its ``hang_after_s``: ``waiting_ranks``, ``missing_ranks`` (members that have not entered
      it), ``waiting_s`` (the longest wait), and ``missing`` (each missing rank's last entered and last
      completed seq in that group, with its step).
    - ``desyncs``: instances entered with more than one (op, dtype, numel) across ranks, from completed
      (comm), waiting and failed (inflight) rows alike: ``sides`` lists each signature and its ranks.
    - ``rank_liveness``: per rank that sent heartbeats: its last beat, step, period, whether it ended
      (RunEnd, or a last heartbeat that says ``ending``),
      whether its stream closed without RunEnd after its last beat (``gone``), whether it left a stack
      request unanswered, ``silent_s`` (now - last beat, by this machine's clock) and ``behind_s`` (the
      run's newest beat - this rank's: silence measured against the other ranks, free of delivery delay
      and of this machine's clock).
    - ``wavefront``: per rank and group, the last seq entered and completed.
    """
    views: dict[str, str] = {}
    views["inflight_latest"] = """
        SELECT * FROM inflight
        QUALIFY row_number() OVER (PARTITION BY run_id, rank, group_name, seq ORDER BY time_ns DESC) = 1"""
    # Per rank and group: how far it has completed (seq is per group and completes in order on
    # a rank, so "completed seq k" is "last completed seq >= k"). One scan of comm serves each view.
    views["comm_progress"] = """
        SELECT run_id, rank, group_name, max(seq) AS last_completed_seq, arg_max(op, seq) AS last_completed_op,
               arg_max(step, seq) AS completed_step
        FROM comm WHERE seq IS NOT NULL AND NOT starts_with(group_name, 'p2p[')
        GROUP BY run_id, rank, group_name"""
    open_rows = """
        SELECT i.run_id, i.rank, i.step, i.group_name, i.group_size, i.group_ranks, i.seq, i.op, i.dtype,
               i.numel, i.bytes, i.entered_ns, i.time_ns, i.hang_after_s,
               (i.time_ns - i.entered_ns) / 1e9 AS waiting_s
        FROM inflight_latest i
        LEFT JOIN (SELECT run_id, rank, max(time_ns) AS last_beat_ns, arg_max(period_s, time_ns) AS period_s
                   FROM heartbeats GROUP BY run_id, rank) b USING (run_id, rank)
        LEFT JOIN {progress} p USING (run_id, rank, group_name)
        LEFT JOIN rank_ends e USING (run_id, rank)
        WHERE coalesce(i.state, 'waiting') = 'waiting' AND e.rank IS NULL
          AND coalesce(p.last_completed_seq, 0) < i.seq
          AND (b.last_beat_ns IS NULL OR i.time_ns >= b.last_beat_ns - CAST(1.5e9 * b.period_s AS BIGINT))"""
    views["inflight_open"] = open_rows.format(progress="comm_progress")
    wavefront = """
        SELECT run_id, rank, group_name,
               greatest(coalesce(e.last_entered_seq, 0), coalesce(d.last_completed_seq, 0)) AS last_entered_seq,
               CASE WHEN coalesce(e.last_entered_seq, 0) > coalesce(d.last_completed_seq, 0)
                    THEN e.last_entered_op ELSE d.last_completed_op END AS last_entered_op,
               coalesce(d.last_completed_seq, 0) AS last_completed_seq, d.last_completed_op,
               greatest(coalesce(e.entered_step, 0), coalesce(d.completed_step, 0)) AS step
        FROM {progress} d FULL OUTER JOIN (
            SELECT run_id, rank, group_name, max(seq) AS last_entered_seq, arg_max(op, seq) AS last_entered_op,
                   arg_max(step, seq) AS entered_step
            FROM inflight GROUP BY run_id, rank, group_name) e USING (run_id, rank, group_name)"""
    views["wavefront"] = wavefront.format(progress="comm_progress")
    views["hangs"] = f"""
        WITH progress AS MATERIALIZED (SELECT * FROM comm_progress),
        open_ AS ({open_rows.format(progress="progress")}),
        wave AS ({wavefront.format(progress="progress")}),
        stuck AS (
            SELECT run_id, group_name, seq, mode(op) AS op, max(waiting_s) AS waiting_s,
                   list(rank ORDER BY rank) AS waiting_ranks, min(step) AS step,
                   any_value({_MEMBERS}) AS members, max(hang_after_s) AS hang_after_s
            FROM open_ GROUP BY run_id, group_name, seq
            HAVING max(waiting_s) >= min(hang_after_s)),
        completed AS (
            SELECT s.run_id, s.group_name, s.seq, list(p.rank) AS ranks
            FROM stuck s JOIN progress p ON p.run_id = s.run_id AND p.group_name = s.group_name
                                       AND p.last_completed_seq >= s.seq
            GROUP BY ALL),
        judged AS (
            SELECT s.*, list_sort(list_filter(s.members, lambda m: NOT list_contains(s.waiting_ranks, m)
                                              AND NOT list_contains(coalesce(c.ranks, []), m))) AS missing_ranks
            FROM stuck s LEFT JOIN completed c USING (run_id, group_name, seq)),
        missing AS (
            SELECT j.run_id, j.group_name, j.seq,
                   list({{'rank': m.rank, 'last_entered_seq': coalesce(w.last_entered_seq, 0),
                          'last_completed_seq': coalesce(w.last_completed_seq, 0), 'step': w.step}}
                        ORDER BY m.rank) AS missing
            FROM judged j, unnest(j.missing_ranks) AS m(rank)
            LEFT JOIN wave w ON w.run_id = j.run_id AND w.rank = m.rank AND w.group_name = j.group_name
            GROUP BY ALL)
        SELECT j.run_id, j.group_name, j.seq, j.op, j.step, j.waiting_ranks, j.missing_ranks, j.waiting_s,
               j.hang_after_s, coalesce(m.missing, []) AS missing
        FROM judged j LEFT JOIN missing m USING (run_id, group_name, seq)"""
    views["desyncs"] = desyncs_sql(
        """SELECT run_id, rank, group_name, seq, op, dtype, numel FROM comm
           WHERE seq IS NOT NULL AND NOT starts_with(group_name, 'p2p[')"""
    )
    views["rank_liveness"] = """
        WITH beats AS (
            SELECT run_id, rank, max(time_ns) AS last_beat_ns, arg_max(step, time_ns) AS step,
                   arg_max(period_s, time_ns) AS period_s, coalesce(bool_or(ending), false) AS ending
            FROM heartbeats GROUP BY run_id, rank),
        events AS (
            SELECT run_id, rank, event, max(epoch_ns(time)) AS at_ns FROM _rank_events_raw GROUP BY ALL)
        SELECT b.run_id, b.rank, b.step, b.period_s, b.last_beat_ns,
               (epoch_ns(now()) - b.last_beat_ns) / 1e9 AS silent_s,
               (max(b.last_beat_ns) OVER (PARTITION BY b.run_id) - b.last_beat_ns) / 1e9 AS behind_s,
               e.rank IS NOT NULL OR b.ending AS ended,
               coalesce(g.at_ns > b.last_beat_ns, false) AS gone,
               CASE WHEN g.at_ns > b.last_beat_ns THEN g.at_ns END AS gone_ns,
               coalesce(u.at_ns > b.last_beat_ns, false) AS unresponsive,
               r.status AS run_status
        FROM beats b
        LEFT JOIN rank_ends e USING (run_id, rank)
        LEFT JOIN events g ON g.run_id = b.run_id AND g.rank = b.rank AND g.event = 'disconnected'
        LEFT JOIN events u ON u.run_id = b.run_id AND u.rank = b.rank AND u.event = 'unresponsive'
        LEFT JOIN runs r ON r.run_id = b.run_id"""
    return views


def _catalog_version() -> str:
    text = "\n".join(f"{k}={v}" for k, v in view_definitions().items())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _create_views(con: duckdb.DuckDBPyConnection, views: dict[str, str], *, temporary: bool) -> None:
    kind = "TEMP VIEW" if temporary else "VIEW"
    for name, select in views.items():  # definitions are ordered so dependencies come first
        con.execute(f"CREATE OR REPLACE {kind} {quote_ident(name)} AS {select}")


def _installed_version(path: Path) -> str | None:
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return None
    try:
        return con.execute(f"SELECT version FROM {quote_ident(VERSION_VIEW)}").fetchone()[0]
    except duckdb.Error:
        return None
    finally:
        con.close()


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
        _create_views(con, view_definitions(), temporary=False)
        con.execute(f"CREATE VIEW {quote_ident(VERSION_VIEW)} AS SELECT {quote_literal(version)} AS version")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    os.replace(tmp, path)
    return path


def connect(data_dir) -> duckdb.DuckDBPyConnection:
    """A read-only connection to D's catalog; every view works from any cwd. Its views read the
    snapshot of D as it is now (``pin``): use it for a while, not for ever, or ``pin`` it again."""
    root = layout.check_data_dir(Path(data_dir).resolve())  # creates nothing in a folder that is not one
    path = ensure_catalog(root)
    con = duckdb.connect(str(path), read_only=True)
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


def _guard_relation(table: str) -> str:
    return f"_segments_{table}"


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
        con.register(_guard_relation(table), _guard_dataset(root, table, schema, hive=hive, snapshot=snapshot))
    _create_views(con, view_definitions(root=None), temporary=False)
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
                timer.cancel()
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
