"""The catalog's views: SELECT text over the Parquet segments, one view per stored table and the
derived ones (ranks, runs, collective instances, stragglers, liveness). collector.data.catalog
installs them in ``D/catalog.duckdb``; collector.data.sql_guard creates them in its private
database over Arrow datasets instead of paths. Changing any text here changes the catalog's
version: every data dir's catalog is rebuilt on its next open (commit the rebuilt
``sample_runs/catalog.duckdb``)."""

from __future__ import annotations

import duckdb

from collector.data import clocks, hang_rule, layout
from collector.data.instances import SIGNATURES_DIFFER, instances_sql, join_condition
from collector.data.schema import TABLES


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


SEGMENTS_VARIABLE = "rankscope_segments"  # table -> the snapshot's files, newline-separated (snapshots.pin)


def _scan(root: str | None, table: str, *, hive: bool) -> str:
    """read_parquet over the pinned snapshot's files of ``table`` or, with none pinned, over every
    segment in its partition folders; root is '' (relative to D). ``root=None`` names the Arrow
    dataset the SQL guard registers instead (sql_guard.readonly_connection)."""
    if root is None:
        return quote_ident(guard_relation(table))
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
        -- Almost every instance agrees: find the few that do not with cheap aggregates
        -- (instances.SIGNATURES_DIFFER: a field a record leaves NULL agrees with anything), and list
        -- the sides of those alone.
        odd AS (
            SELECT run_id, group_name, seq FROM entered GROUP BY ALL
            HAVING {SIGNATURES_DIFFER}),
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
    # RunEnd(finished), failed as soon as one rank failed, stopped (ended by its user: Ctrl-C,
    # a stop signal) once every rank ended and one or more of them were stopped. A rank's end
    # counts whether or not its Hello was stored: a run stopped while its ranks started has ranks
    # that never said Hello, whose end the stop's supervisor records for them
    # (collector.tools.supervise.end_unended_runs); n_ranks counts the ranks that said Hello.
    views["runs"] = """
        WITH first_hello AS (
            SELECT * FROM _runs_raw
            QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY started_at) = 1),
        every_rank AS (
            SELECT run_id, status, ended_at, true AS said_hello FROM ranks
            UNION ALL
            SELECT e.run_id, e.status, e.ended_at, false AS said_hello
            FROM rank_ends e ANTI JOIN ranks r ON e.run_id = r.run_id AND e.rank = r.rank),
        per_run AS (
            SELECT run_id, count(*) FILTER (WHERE said_hello) AS n_ranks,
                   count(*) FILTER (WHERE status = 'failed') AS n_failed,
                   count(*) FILTER (WHERE status = 'finished') AS n_finished,
                   count(*) FILTER (WHERE status = 'stopped') AS n_stopped,
                   max(ended_at) AS last_end
            FROM every_rank GROUP BY run_id),
        judged AS (
            SELECT h.*, coalesce(p.n_ranks, 0) AS n_ranks, p.last_end,
                   CASE WHEN coalesce(p.n_failed, 0) > 0 THEN 'failed'
                        WHEN coalesce(p.n_stopped, 0) > 0
                             AND p.n_stopped + p.n_finished >= h.world_size THEN 'stopped'
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
            HAVING {hang_rule.HUNG_SQL}),
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


def guard_relation(table: str) -> str:
    """The name of the Arrow dataset the SQL guard registers for ``table``."""
    return f"_segments_{table}"


def create_views(con: duckdb.DuckDBPyConnection, views: dict[str, str], *, temporary: bool) -> None:
    kind = "TEMP VIEW" if temporary else "VIEW"
    for name, select in views.items():  # definitions are ordered so dependencies come first
        con.execute(f"CREATE OR REPLACE {kind} {quote_ident(name)} AS {select}")
